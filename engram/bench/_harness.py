"""Shared benchmark machinery: the raw gRPC echo baseline and latency/throughput loops.

Every benchmark starts :class:`EchoServer` in its own run and reports its
figures next to the echo's, so results on a shared, noisy machine compare like
with like. The echo has no interceptors, no auth and no storage: it is the
ceiling for any RPC on this machine.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram.client._channel import reconnect_options

_ECHO_METHOD = "/engram.bench.Echo/Echo"


class BenchUnavailable(RuntimeError):
    """A benchmark cannot run here (e.g. an optional dependency is missing); says what to do."""


class EchoServer:
    """A raw gRPC echo (bytes in, bytes out) on 127.0.0.1, thread pool shaped like the services."""

    def __init__(self, max_workers: int = 32) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        handler = grpc.method_handlers_generic_handler(
            "engram.bench.Echo",
            {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request)},
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> EchoServer:
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.stop(0).wait()

    def client(self) -> tuple[grpc.Channel, Callable[[bytes], bytes]]:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        call = channel.unary_unary(_ECHO_METHOD, None, None)
        return channel, call


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p95_ms: float
    p99_ms: float
    count: int

    @classmethod
    def of(cls, samples_s: list[float]) -> Latency:
        ordered = sorted(samples_s)

        def pct(p: float) -> float:
            index = min(len(ordered) - 1, max(0, round(p * (len(ordered) - 1))))
            return round(ordered[index] * 1000, 4)

        return cls(pct(0.50), pct(0.95), pct(0.99), len(ordered))


def sequential(call: Callable[[int], object], count: int, warmup: int = 50) -> Latency:
    """Latency of ``count`` calls made one after another."""
    for i in range(warmup):
        call(-1 - i)
    samples = []
    for i in range(count):
        start = time.perf_counter()
        call(i)
        samples.append(time.perf_counter() - start)
    return Latency.of(samples)


def concurrent(call: Callable[[int], object], total: int, in_flight: int) -> float:
    """Calls per second with ``in_flight`` callers sharing ``total`` calls."""
    counter = iter(range(total))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            call(i)

    threads = [threading.Thread(target=worker) for _ in range(in_flight)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return total / (time.perf_counter() - start)


def echo_baseline(
    sequential_calls: int = 2000,
    concurrent_calls: int = 20000,
    in_flight: int = 64,
    payload: bytes = b"x" * 256,
) -> dict[str, float]:
    """The echo runs in its own process, as the services do, so both pay the same IPC."""
    with ServerProcess([sys.executable, "-m", "engram.bench._harness"], {}) as echo:
        channel = grpc.insecure_channel(echo.address)
        call = channel.unary_unary(_ECHO_METHOD, None, None)
        try:
            latency = sequential(lambda _i: call(payload), sequential_calls)
            rate = concurrent(lambda _i: call(payload), concurrent_calls, in_flight)
        finally:
            channel.close()
    return {
        "echo_p50_ms": latency.p50_ms,
        "echo_p95_ms": latency.p95_ms,
        "echo_calls_per_s": round(rate, 1),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


UNTHROTTLED = {**{f"ENGRAM_{service}_RATE_LIMIT_{kind}": "0"
                  for service in ("SHARD", "GOVERNANCE", "ARTIFACTS", "COMPACTOR")
                  for kind in ("READS", "WRITES")},
               "ENGRAM_SHARD_RATE_LIMIT_RECORDS": "0"}
"""A benchmark measures capacity, not one agent's allowance: per-agent rate limits off."""


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the service drains), then SIGKILL after 20 s; reaped either way."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ServerProcess:
    """A server in a child process on a free loopback port; waits for grpc.health SERVING."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        port: int | None = None,
        port_env: str = "ENGRAM_BENCH_ECHO_PORT",
        timeout: float = 60.0,
        log_path: Path | None = None,
        health_service: str = "",
    ) -> None:
        self.port = port or free_port()
        # The service's own health name: another server that took the port first answers
        # NOT_FOUND for it, never SERVING (with "" any server there would do).
        self._health_service = health_service
        self.address = f"127.0.0.1:{self.port}"
        self._argv = argv
        self._env = {**UNTHROTTLED, **os.environ, **env, port_env: str(self.port)}
        self._timeout = timeout
        self._log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        # A service under minutes of load may log more than a pipe holds: give it a file then.
        log = self._log_path.open("ab") if self._log_path else None
        try:
            self.process = subprocess.Popen(
                self._argv, env=self._env, stdout=subprocess.DEVNULL,
                stderr=log if log else subprocess.PIPE,
            )
        finally:
            if log:
                log.close()
        try:
            self._wait_serving(self.process)
        except BaseException:  # a server that never served is not left running
            self.__exit__()
            raise
        return self

    def _wait_serving(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self._timeout
        # Without a short reconnect backoff the probe itself would see SERVING up to seconds late.
        with grpc.insecure_channel(self.address, options=reconnect_options(50)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"{self._argv} exited early: {self._stderr_tail()}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(service=self._health_service),
                                  timeout=1).status == 1:
                        return
                except grpc.RpcError:
                    time.sleep(0.1)
        # (a pipe is not read here: the process still runs, the read would wait for its end)
        tail = f": {self._stderr_tail()}" if self._log_path is not None else ""
        raise RuntimeError(f"{self._argv} did not become SERVING in {self._timeout}s{tail}")

    def _stderr_tail(self) -> str:
        if self._log_path is not None:
            return self._log_path.read_text(errors="replace")[-2000:]
        assert self.process is not None
        return self.process.stderr.read().decode()[-2000:] if self.process.stderr else ""

    def __exit__(self, *_exc: object) -> None:
        if self.process:
            stop_process(self.process)
        if self.process and self.process.stderr:
            self.process.stderr.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def shard_process(home: Path, *, embedder: str, timeout: float = 60.0) -> ServerProcess:
    """A shard alone (no governance: the gated figures are `engram bench gate`) on SQLite.

    Its schema is migrated first, from this process, as a deployment's migration Job does
    (docs/deploy.md): a replica that migrates itself holds alembic (11.5 MB) until its next
    start, and the figures are a serving replica's."""
    url = f"sqlite:///{home / 'shard.db'}"
    _migrate_shard(url)
    env = {
        "ENGRAM_HOME": str(home),
        "ENGRAM_SHARD_DB_URL": url,
        "ENGRAM_LOG_LEVEL": "WARNING",
        "ENGRAM_SHARD_ALLOW_UNGATED": "true",
        "ENGRAM_SHARD_EMBEDDER": embedder,
    }
    return ServerProcess(
        [sys.executable, "-m", "services.shard"], env, port_env="ENGRAM_SHARD_PORT",
        timeout=timeout,
    )


def _migrate_shard(url: str) -> None:
    from services.common.db import Database
    from services.shard.server import MIGRATIONS

    database = Database(url)
    try:
        database.prepare_schema(MIGRATIONS, "shard", migrate=True)
    finally:
        database.dispose()


def _serve_echo() -> None:
    from grpc_health.v1 import health

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    handler = grpc.method_handlers_generic_handler(
        "engram.bench.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request)},
    )
    server.add_generic_rpc_handlers((handler,))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{os.environ['ENGRAM_BENCH_ECHO_PORT']}")
    server.start()
    server.wait_for_termination()


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a shard's embedder child counts as the shard's)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:  # exited meanwhile
        return 0
    raise RuntimeError(f"{field} not found for process {pid}")


def rss_mb(pid: int | None = None) -> float:
    """Resident set size of a process (default: this one) and its children, from /proc.

    Summed: pages the processes share are counted once per process, so this is an upper bound.
    """
    return tree_rss_mb(process_tree(pid or os.getpid()))


def tree_rss_mb(pids: Sequence[int]) -> float:
    """Summed RSS of processes found beforehand (a sampler walks /proc once, not per sample)."""
    return round(sum(_status_kb(p, "VmRSS:") for p in pids) / 1024, 1)


def pss_mb(pid: int | None = None) -> float | None:
    """Proportional set size of a process and its children, from /proc/PID/smaps_rollup: each
    page shared by N processes counts 1/N in each, so unlike :func:`rss_mb` the sum over a
    tree counts what the processes share (libraries, a file both map) once. None where the
    kernel gives no rollup (before Linux 4.14) or it may not be read: not a figure of 0."""
    total_kb = 0
    for process in process_tree(pid or os.getpid()):
        try:
            with open(f"/proc/{process}/smaps_rollup") as rollup:
                total_kb += next((int(line.split()[1]) for line in rollup
                                  if line.startswith("Pss:")), 0)
        except (FileNotFoundError, ProcessLookupError):
            if os.path.exists(f"/proc/{process}"):  # the process is there, its rollup is not
                return None
            continue  # exited meanwhile
        except OSError:  # permission denied, a sandbox
            return None
    return round(total_kb / 1024, 1)


def peak_rss_mb(pid: int | None = None) -> float:
    """Sum of each process's own peak (the peaks need not coincide: an upper bound)."""
    return round(sum(_status_kb(p, "VmHWM:") for p in process_tree(pid or os.getpid())) / 1024, 1)


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


if __name__ == "__main__":
    _serve_echo()
