"""`engram bench shard`: the shard service against a raw gRPC echo, same run, same machine.

Starts a raw echo and a shard (SQLite, synchronous=FULL: every acknowledged
write is on disk; lexical search only, no governance) each in its own process
on 127.0.0.1, then measures: sequential single writes, writes with 64 in
flight, batch ingest (100 per call) up to ``100k x scale`` records, lexical
search at that size, and the shard process's RSS. Records and queries are
drawn from a 6,000-word vocabulary with Zipf-distributed frequencies, like
natural text: some query words are common, most are rare (engram.bench._corpus).
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from rich.progress import Progress

from engram.bench._corpus import Corpus, pseudo_words
from engram.bench._harness import (
    Latency,
    concurrent,
    echo_baseline,
    peak_rss_mb,
    rss_mb,
    sequential,
    shard_process,
)
from engram.client import ShardClient, record_input
from services.common.tokens import TokenSigner, ensure_keypair

_CORPUS = Corpus(pseudo_words())


def run(scale: float = 1.0, progress: bool = True) -> dict[str, object]:
    total_records = max(2000, int(100_000 * scale))
    single = max(200, int(2000 * scale))
    in_flight_total = max(1000, int(10_000 * scale))
    searches = max(200, int(1000 * scale))
    rng = random.Random(7)
    figures: dict[str, object] = {}
    figures.update(echo_baseline(sequential_calls=single, concurrent_calls=in_flight_total))
    with (
        tempfile.TemporaryDirectory(prefix="engram-bench-") as tmp,
        Progress(disable=not progress, transient=True) as bar,
    ):
        home = Path(tmp)
        keys = ensure_keypair(home)
        token = TokenSigner.load(keys.private).issue("bench-agent", "bench", {"agent"})
        with (
            shard_process(home, embedder="none") as shard,
            ShardClient(shard.address, token) as client,
        ):
            task = bar.add_task("single writes", total=None)
            latency = sequential(lambda i: client.add(_CORPUS.sentence(10_000_000 + i)), single)
            figures["write_p50_ms"] = latency.p50_ms
            figures["write_p95_ms"] = latency.p95_ms
            bar.update(task, description="64 writes in flight")
            figures["write_calls_per_s"] = round(
                concurrent(
                    lambda i: client.add(_CORPUS.sentence(20_000_000 + i)),
                    in_flight_total,
                    64,
                ),
                1,
            )
            bar.update(task, description="batch ingest", total=total_records, completed=0)
            written = 0
            start = time.perf_counter()
            while written < total_records:
                batch = [
                    record_input(_CORPUS.sentence(written + j), importance=rng.random())
                    for j in range(100)
                ]
                client.add_many(batch)
                written += len(batch)
                bar.update(task, completed=written)
            figures["batch_records_per_s"] = round(written / (time.perf_counter() - start), 1)
            bar.update(task, description="lexical search", total=None)
            queries = [" ".join(_CORPUS.words(3)) for _ in range(searches)]
            search = sequential(lambda i: client.search(queries[i % len(queries)]), searches)
            figures["search_p50_ms"] = search.p50_ms
            figures["search_p95_ms"] = search.p95_ms
            figures["records"] = int(client.status().total_records)
            figures["rss_mb"] = rss_mb(shard.pid)
            figures["peak_rss_mb"] = peak_rss_mb(shard.pid)
    echo_p50 = float(figures["echo_p50_ms"])  # type: ignore[arg-type]
    echo_rate = float(figures["echo_calls_per_s"])  # type: ignore[arg-type]
    figures["write_p50_vs_echo"] = round(float(figures["write_p50_ms"]) / echo_p50, 2)  # type: ignore[arg-type]
    figures["write_rate_vs_echo"] = round(float(figures["write_calls_per_s"]) / echo_rate, 3)  # type: ignore[arg-type]
    figures["targets"] = {
        "write_p50 <= 2x echo": figures["write_p50_vs_echo"] <= 2.0,  # type: ignore[operator]
        "64-in-flight >= 60% echo": figures["write_rate_vs_echo"] >= 0.6,  # type: ignore[operator]
        "batch >= 10k records/s": figures["batch_records_per_s"] >= 10_000,  # type: ignore[operator]
        "search p95 <= 3 ms": figures["search_p95_ms"] <= 3.0,  # type: ignore[operator]
        "rss <= 300 MB": figures["rss_mb"] <= 300,  # type: ignore[operator]
    }
    return figures


__all__ = ["Latency", "run"]
