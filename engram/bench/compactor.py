"""`engram bench compactor`: iteration logs against a raw gRPC echo, same run, same machine.

Starts a raw echo and a compactor (SQLite with synchronous=FULL, file:// blobs) each in its
own process on 127.0.0.1, then measures: durable RecordIteration latency, records per second
with 16 writers in flight (group commit shares one fsync among them), the cost of an
append late in a 1k-iteration run and late in a 10k-iteration run (it should not grow with
run length), and ReconstructIteration latency for random iterations of the 10k run, whose
warm log spans several sealed segments (rotation at 1 MB here so the segment path is used).
It also times a bare one-row sqlite3 commit (WAL, synchronous=FULL) on the same disk: the
fsync floor under a durable record, so the report separates the service's cost from the disk's.
"""

from __future__ import annotations

import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp
from rich.progress import Progress

from engram.bench._harness import (
    Latency,
    ServerProcess,
    concurrent,
    echo_baseline,
    rss_mb,
    sequential,
)
from engram.client.compactor import CompactorClient
from engram.compactor.v1 import compactor_service_pb2 as pb
from services.common.auth import service_principal
from services.common.tokens import TokenSigner, ensure_keypair, write_token_file

ROTATE_BYTES = 1024 * 1024
_WINDOW = 200
_IN_FLIGHT = 16


def _iteration(n: int, rng: random.Random) -> pb.IterationInput:
    start = Timestamp(seconds=1_755_000_000 + n * 60)
    end = Timestamp(seconds=1_755_000_000 + n * 60 + 45)
    context = " ".join(rng.choice(("plan", "edit", "test", "lint", "diff", "retry", "merge"))
                       for _ in range(250))
    return pb.IterationInput(
        iteration=n, plan_digest=f"{rng.getrandbits(128):032x}",
        parent_digest=f"{rng.getrandbits(128):032x}", start_time=start, end_time=end,
        files_touched=rng.randint(0, 20), net_add=rng.randint(0, 400),
        net_del=rng.randint(0, 200), risk_score=round(rng.random(), 3), status="success",
        detail_json=f'{{"context": "{context}", "n": {n}}}',
        guardrails_json='[{"stage": "tests", "ok": true}, {"stage": "lint", "ok": true}]')


def _commit_floor(home: Path, count: int = 200) -> Latency:
    """One-row commits on raw sqlite3 (WAL, synchronous=FULL) in the bench's directory.

    What one fsync'd commit costs on this disk: the floor under a durable record that
    nothing shares its commit with.
    """
    connection = sqlite3.connect(home / "floor.db", isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("CREATE TABLE line (n INTEGER PRIMARY KEY, body TEXT)")
        body = "x" * 2048

        def commit(i: int) -> None:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO line VALUES (?, ?)", (i + 1000, body))
            connection.execute("COMMIT")

        return sequential(lambda i: commit(i), count, warmup=20)
    finally:
        connection.close()


def _compactor_process(home: Path) -> ServerProcess:
    env = {
        "ENGRAM_HOME": str(home),
        "ENGRAM_COMPACTOR_DB_URL": f"sqlite:///{home / 'compactor.db'}",
        "ENGRAM_COMPACTOR_BLOB_URL": (home / "blobs").as_uri(),
        "ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE": str(home / "auth" / "compactor.token"),
        "ENGRAM_COMPACTOR_ROTATE_BYTES": str(ROTATE_BYTES),
        "ENGRAM_LOG_LEVEL": "WARNING",
    }
    return ServerProcess([sys.executable, "-m", "services.compactor"], env,
                         port_env="ENGRAM_COMPACTOR_PORT")


def _next(n: int) -> pb.IterationInput:
    """An iteration appended as the run's next one (iteration 0), for writers in parallel."""
    item = _iteration(n, random.Random(n))
    item.iteration = 0
    return item


def _fill(client: CompactorClient, run: str, total: int, rng: random.Random,
          on_step: object = None) -> Latency:
    """Record ``total`` iterations; return the latency of the last ``_WINDOW`` appends."""
    samples: list[float] = []
    for n in range(1, total + 1):
        item = _iteration(n, rng)
        start = time.perf_counter()
        client.record(run, item)
        if n > total - _WINDOW:
            samples.append(time.perf_counter() - start)
        if callable(on_step):
            on_step()
    return Latency.of(samples)


def run(scale: float = 1.0, progress: bool = True) -> dict[str, object]:
    single = max(300, int(2000 * scale))
    short_run = 1000
    long_run = max(2000, int(10_000 * scale))
    reconstructs = max(200, int(1000 * scale))
    rng = random.Random(5)
    figures: dict[str, object] = {}
    figures.update(echo_baseline(sequential_calls=single, concurrent_calls=single * 5))
    with tempfile.TemporaryDirectory(prefix="engram-bench-") as tmp, Progress(
            disable=not progress, transient=True) as bar:
        home = Path(tmp)
        signer = TokenSigner.load(ensure_keypair(home).private)
        write_token_file(home / "auth" / "compactor.token",
                         signer.issue(*service_principal("compactor")))
        token = signer.issue("bench-agent", "bench", {"agent"})
        with _compactor_process(home) as server, CompactorClient(server.address, token) as client:
            task = bar.add_task("durable records", total=None)
            latency = sequential(lambda i: client.record("bench-seq", _iteration(i + 51, rng))
                                 if i >= 0 else client.record("bench-seq",
                                                              _iteration(-i, rng)), single)
            figures["record_p50_ms"] = latency.p50_ms
            figures["record_p95_ms"] = latency.p95_ms
            bar.update(task, description=f"records, {_IN_FLIGHT} in flight")
            figures[f"records_per_s_{_IN_FLIGHT}_in_flight"] = round(concurrent(
                lambda i: client.record(f"bench-par-{i % _IN_FLIGHT}", _next(i)),
                single * 2, _IN_FLIGHT), 1)
            bar.update(task, description=f"{short_run}-iteration run", total=short_run,
                       completed=0)
            at_1k = _fill(client, "bench-1k", short_run, rng, lambda: bar.advance(task))
            bar.update(task, description=f"{long_run}-iteration run", total=long_run,
                       completed=0)
            at_10k = _fill(client, "bench-10k", long_run, rng, lambda: bar.advance(task))
            figures[f"append_p50_ms_at_{short_run}"] = at_1k.p50_ms
            figures[f"append_p50_ms_at_{long_run}"] = at_10k.p50_ms
            figures["append_cost_ratio_long_vs_short"] = round(at_10k.p50_ms / at_1k.p50_ms, 2)
            bar.update(task, description="reconstruct", total=None)
            picks = [rng.randint(1, long_run) for _ in range(reconstructs)]
            rebuilt = sequential(lambda i: client.reconstruct("bench-10k", picks[i % len(picks)]),
                                 reconstructs, warmup=20)
            figures["reconstruct_p50_ms"] = rebuilt.p50_ms
            figures["reconstruct_p95_ms"] = rebuilt.p95_ms
            report = client.verify("bench-10k")
            figures["long_run_segments"] = report.segments_checked
            figures["long_run_verified"] = report.ok
            figures["rss_mb"] = rss_mb(server.pid)
        floor = _commit_floor(home)
        figures["sqlite_full_commit_p50_ms"] = floor.p50_ms
    figures["rotate_bytes"] = ROTATE_BYTES
    echo_p50 = float(figures["echo_p50_ms"])  # type: ignore[arg-type]
    record_p50 = float(figures["record_p50_ms"])  # type: ignore[arg-type]
    figures["record_p50_vs_echo"] = round(record_p50 / echo_p50, 2)
    figures["record_p50_minus_commit_floor_ms"] = round(record_p50 - floor.p50_ms, 4)
    figures[f"records_per_s_{_IN_FLIGHT}_in_flight_vs_echo"] = round(
        float(figures[f"records_per_s_{_IN_FLIGHT}_in_flight"])  # type: ignore[arg-type]
        / float(figures["echo_calls_per_s"]), 3)  # type: ignore[arg-type]
    figures["targets"] = {
        "record p50 <= 2x echo p50": record_p50 <= 2 * echo_p50,
        "reconstruct p95 <= 50 ms": float(figures["reconstruct_p95_ms"]) <= 50.0,  # type: ignore[arg-type]
        "append cost independent of run length (ratio <= 1.5)":
            float(figures["append_cost_ratio_long_vs_short"]) <= 1.5,  # type: ignore[arg-type]
    }
    return figures


__all__ = ["run"]
