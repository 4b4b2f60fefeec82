"""`engram bench scale`: a lexical-only shard at 100k and ``--records`` records, and its restart.

The records are those of `engram bench search` (English words, Zipf frequencies, 50 per
run), batch-written 100 per call with the embedder off. At 100k and at ``--records``:
lexical search p50/p95 and the shard's RSS. Then the shard is stopped (it saves its index)
and started again on the same store: seconds to SERVING and to the first answered search,
lexical p95 and RSS after the restart, the index snapshot's size and the store's bytes per
record. ``--home`` keeps the store in that directory (and reuses the records already there),
so a 1M-record store is written once and the restart measured again later.

``--fleets N`` spreads the records over N fleets (each run of 50 records in one fleet, fleets
in turn, each with its own token); queries go to the fleets in turn. A kept store remembers
its fleet count (``bench-scale.json``) and refuses another.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from engram.bench._corpus import Corpus, english_words
from engram.bench._harness import BenchUnavailable, rss_mb, sequential, shard_process
from engram.client import ShardClient, record_input
from services.common.tokens import TokenSigner, ensure_keypair

CORPUS = Corpus(english_words(), seed=5)
QUERIES = 300


RUN = 50  # records a run holds


def _ingest(clients: list[ShardClient], start: int, target: int) -> None:
    """Records ``start`` .. ``target`` - 1; record i is in run i // 50, of fleet run % N."""
    written = start
    while written < target:
        run = written // RUN
        count = min(100, target - written, (run + 1) * RUN - written)  # one run, one fleet
        clients[run % len(clients)].add_many(
            [record_input(CORPUS.sentence(written + j), run_id=f"run-{run}")
             for j in range(count)])
        written += count


def _lexical(clients: list[ShardClient]) -> dict[str, float]:
    queries = [" ".join(CORPUS.words(4)) for _ in range(QUERIES)]
    latency = sequential(lambda i: clients[i % len(clients)].search(
        queries[i % QUERIES], mode="lexical"), QUERIES)
    return {"lexical_p50_ms": latency.p50_ms, "lexical_p95_ms": latency.p95_ms}


def _fleets_of(where: Path, fleets: int) -> None:
    """The store's fleet count, written at first use; another count is refused."""
    marker = where / "bench-scale.json"
    if marker.exists():
        kept = int(json.loads(marker.read_text())["fleets"])
        if kept != fleets:
            raise BenchUnavailable(f"{where} holds records spread over {kept} fleet(s); run "
                                   f"with --fleets {kept} or another --home")
    else:
        marker.write_text(json.dumps({"fleets": fleets}) + "\n")


def _total(clients: list[ShardClient]) -> int:
    return sum(int(client.status().total_records) for client in clients)


@contextmanager
def _clients(address: str, tokens: list[str]) -> Iterator[list[ShardClient]]:
    with ExitStack() as stack:
        yield [stack.enter_context(ShardClient(address, token)) for token in tokens]


@contextmanager
def _home(given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="engram-bench-scale-") as tmp:
        yield Path(tmp)


def run(scale: float = 1.0, progress: bool = True, records: int = 1_000_000,
        home: Path | None = None, fleets: int = 1) -> dict[str, object]:
    sizes = sorted({max(2000, int(100_000 * scale)), max(2000, int(records * scale))})
    figures: dict[str, object] = {"fleets": fleets}
    with _home(home) as where:
        _fleets_of(where, fleets)
        signer = TokenSigner.load(ensure_keypair(where).private)
        names = ["bench"] if fleets == 1 else [f"bench-{i:03d}" for i in range(fleets)]
        tokens = [signer.issue("bench", name, {"agent"}) for name in names]
        # A store written before index snapshots existed is indexed once before SERVING.
        began = time.monotonic()
        with shard_process(where, embedder="none", timeout=3600) as shard, \
                _clients(shard.address, tokens) as clients:
            figures["start_to_serving_s"] = round(time.monotonic() - began, 2)
            done = _total(clients)
            figures["rss_mb_empty"] = rss_mb(shard.pid) if not done else None
            for size in sizes:
                if done < size:
                    if progress:
                        print(f"writing records {done} -> {size}", flush=True)
                    _ingest(clients, done, size)
                    done = size
                if done == size:
                    for name, value in _lexical(clients).items():
                        figures[f"{name}_at_{size}"] = value
                    figures[f"rss_mb_at_{size}"] = rss_mb(shard.pid)
            figures["records"] = done = _total(clients)
        began = time.monotonic()
        with shard_process(where, embedder="none", timeout=3600) as shard:  # may rebuild
            figures["restart_to_serving_s"] = round(time.monotonic() - began, 2)
            with _clients(shard.address, tokens) as clients:
                clients[0].search(" ".join(CORPUS.words(4)), mode="lexical")
                figures["restart_to_first_search_s"] = round(time.monotonic() - began, 2)
                for name, value in _lexical(clients).items():
                    figures[f"{name}_after_restart"] = value
                figures["rss_mb_after_restart"] = rss_mb(shard.pid)
        snapshot = where / "shard" / "lexical-index.snapshot"
        figures["snapshot_bytes_per_record"] = round(snapshot.stat().st_size / done, 1)
        store = sum(p.stat().st_size for p in where.glob("shard.db*"))
        figures["store_bytes_per_record"] = round(store / done, 1)
        empty = figures["rss_mb_empty"]
        if isinstance(empty, float):  # a fresh store: the process's own size is known
            after = float(figures["rss_mb_after_restart"])  # type: ignore[arg-type]
            figures["rss_bytes_per_record"] = round((after - empty) * 2**20 / done, 1)
    return figures
