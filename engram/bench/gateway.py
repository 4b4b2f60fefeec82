"""`engram bench gateway`: what the HTTP/JSON gateway adds over calling the service directly.

A shard (SQLite, lexical, no governance) in its own process, the gateway (`engram gateway`)
in another, both on 127.0.0.1. The same records are read by id through the Python SDK (gRPC)
and through the gateway (HTTP/1.1 keep-alive, stdlib client) in the same run, one call at a
time and with several callers at once; a lexical search is timed both ways too.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engram.bench._harness import (
    BenchUnavailable,
    Latency,
    concurrent,
    echo_baseline,
    free_port,
    rss_mb,
    shard_process,
    stop_process,
)
from engram.client import ShardClient
from services.common.tokens import TokenSigner, ensure_keypair

_IN_FLIGHT = 16


class GatewayProcess:
    """`engram gateway` in a child process, ready when /healthz answers."""

    def __init__(self, home: Path, shard_addr: str, timeout: float = 30.0) -> None:
        self.port = free_port()
        self._argv = [sys.executable, "-m", "engram.cli.main", "gateway", "--port",
                      str(self.port)]
        self._env = {"ENGRAM_HOME": str(home), "ENGRAM_SHARD_ADDR": shard_addr}
        self._timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GatewayProcess:
        self.process = subprocess.Popen(self._argv, env={**os.environ, **self._env},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode()[-2000:] if self.process.stderr else ""
                raise RuntimeError(f"engram gateway exited early: {err}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    connection.close()
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"engram gateway did not answer in {self._timeout}s")

    def __exit__(self, *_exc: object) -> None:
        if self.process:
            stop_process(self.process)


class HttpCaller:
    """One keep-alive connection per thread, as an HTTP client pool would hold."""

    def __init__(self, port: int, token: str) -> None:
        self._port = port
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._local = threading.local()

    def __call__(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=30)
            self._local.connection = connection
        connection.request(method, path, body=json.dumps(body) if body is not None else None,
                           headers=self._headers)
        response = connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status} {payload[:200]!r}")
        return json.loads(payload)


def _interleaved(first: Callable[[int], object], second: Callable[[int], object],
                 count: int, warmup: int = 50) -> tuple[Latency, Latency]:
    """Both calls timed alternately, so drift on a shared machine hits both sides alike."""
    for i in range(warmup):
        first(i)
        second(i)
    samples: tuple[list[float], list[float]] = ([], [])
    for i in range(count):
        for call, into in ((first, samples[0]), (second, samples[1])):
            start = time.perf_counter()
            call(i)
            into.append(time.perf_counter() - start)
    return Latency.of(samples[0]), Latency.of(samples[1])


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else 0.0


def run(scale: float = 1.0, progress: bool = True) -> dict[str, object]:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as error:
        raise BenchUnavailable(f"`engram bench gateway` needs the gateway extra: pip install "
                               f"'engram[gateway]' ({error.name} is missing)") from None
    calls = max(300, int(2000 * scale))
    records = 200
    figures: dict[str, object] = {}
    figures.update(echo_baseline(sequential_calls=calls, concurrent_calls=calls * 5))
    with tempfile.TemporaryDirectory(prefix="engram-bench-") as tmp:
        home = Path(tmp)
        signer = TokenSigner.load(ensure_keypair(home).private)
        token = signer.issue("bench-agent", "bench", {"agent"})
        with shard_process(home, embedder="none") as shard, \
                ShardClient(shard.address, token) as client, \
                GatewayProcess(home, shard.address) as gateway:
            ids = [client.add(f"gateway bench record {n}: fact {n * 13} about topic {n % 17}",
                              run_id="bench-gw").record.id for n in range(records)]
            http_call = HttpCaller(gateway.port, token)

            def sdk_get(i: int) -> object:
                return client.get(ids[i % records])

            def http_get(i: int) -> object:
                return http_call("GET", f"/v1/records/{ids[i % records]}")

            sdk, via_http = _interleaved(sdk_get, http_get, calls)
            figures["sdk_get_p50_ms"], figures["sdk_get_p95_ms"] = sdk.p50_ms, sdk.p95_ms
            figures["http_get_p50_ms"] = via_http.p50_ms
            figures["http_get_p95_ms"] = via_http.p95_ms
            figures["gateway_overhead_p50_ms"] = round(via_http.p50_ms - sdk.p50_ms, 4)
            figures["gateway_overhead_p95_ms"] = round(via_http.p95_ms - sdk.p95_ms, 4)
            figures["http_vs_sdk_p50"] = _ratio(via_http.p50_ms, sdk.p50_ms)

            query = {"query": "fact about topic", "limit": 10, "mode": "SEARCH_MODE_LEXICAL"}
            searches = max(100, calls // 4)
            sdk_search, http_search = _interleaved(
                lambda _i: client.search("fact about topic", limit=10, mode="lexical"),
                lambda _i: http_call("POST", "/v1/records:search", query), searches)
            figures["sdk_search_p50_ms"] = sdk_search.p50_ms
            figures["http_search_p50_ms"] = http_search.p50_ms
            figures["search_overhead_p50_ms"] = round(http_search.p50_ms - sdk_search.p50_ms, 4)

            figures[f"sdk_gets_per_s_{_IN_FLIGHT}_in_flight"] = round(
                concurrent(sdk_get, calls * 2, _IN_FLIGHT), 1)
            figures[f"http_gets_per_s_{_IN_FLIGHT}_in_flight"] = round(
                concurrent(http_get, calls * 2, _IN_FLIGHT), 1)
            assert gateway.process is not None
            figures["gateway_rss_mb"] = rss_mb(gateway.process.pid)
    figures["http_vs_sdk_throughput"] = _ratio(
        float(figures[f"http_gets_per_s_{_IN_FLIGHT}_in_flight"]),  # type: ignore[arg-type]
        float(figures[f"sdk_gets_per_s_{_IN_FLIGHT}_in_flight"]))  # type: ignore[arg-type]
    return figures


__all__ = ["run"]
