"""`engram bench chroma`: Engram beside Chroma (embedded) in the same run, on like records.

Optional: Chroma is not one of Engram's dependencies; `make compare-setup` installs it into
.venv from requirements-compare.lock. Both sides use all-MiniLM-L6-v2 and 10k x scale records from
`engram bench search`'s generator (same distribution and seed, drawn, not replayed);
Chroma runs in a child process (engram.bench._chroma_side) so each side's RSS is its own.
Chroma runs twice: as users get it (``chroma``: its default embedder, float32 MiniLM, its
model written from the installed package rather than downloaded) and with the shard's int8
embedder (``chroma_engram_embedder``: the stores compared, not the embedders). Compared
against each, as issue 6 asks:
- acknowledged writes (Engram: the better of one at a time and 64 in flight, waiting only
  for the durable commit) against Chroma adding one record at a time (embedded on add);
- Engram's semantic indexing rate against Chroma's batch-of-100 adds;
- search p95 at the same size, query embedding included on both sides (Engram hybrid, the
  default; Engram's semantic mode, Chroma's only kind, is reported beside it);
- RSS with the model loaded (Engram: shard plus embedder process), and beside it PSS (each
  page shared by the two processes counted once), which is not a target.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import cast

from rich.progress import Progress

from engram.bench._harness import BenchUnavailable, pss_mb, rss_mb, shard_process
from engram.bench.search import acknowledged_writes, ingest, searches, wait_indexed
from engram.client import ShardClient
from services.common.tokens import TokenSigner, ensure_keypair


def _chroma(embedder: str, size: int, single: int, count: int) -> dict[str, float]:
    command = [
        sys.executable, "-m", "engram.bench._chroma_side", "--embedder", embedder,
        "--size", str(size), "--single", str(single), "--searches", str(count),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Chroma's side failed ({done.returncode}): {done.stderr[-2000:]}")
    return cast(dict[str, float], json.loads(done.stdout.strip().splitlines()[-1]))


def _engram(size: int, single: int, count: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="engram-bench-chroma-") as tmp:
        home = Path(tmp)
        token = TokenSigner.load(ensure_keypair(home).private).issue("bench", "bench", {"agent"})
        with (
            shard_process(home, embedder="minilm") as shard,
            ShardClient(shard.address, token) as client,
        ):
            writes = acknowledged_writes(client, single)
            figures.update({f"engram_{key}": value for key, value in writes.items()})
            wait_indexed(client)
            figures["engram_indexed_records_per_s"] = round(
                ingest(client, int(client.status().total_records), size), 1
            )
            for name, value in searches(client, count, ("hybrid", "semantic")).items():
                figures[f"engram_{name}_at_{size}"] = value
            figures[f"engram_rss_mb_at_{size}"] = rss_mb(shard.pid)
            if (pss := pss_mb(shard.pid)) is not None:  # None: no rollup to read here
                figures[f"engram_pss_mb_at_{size}"] = pss
    return figures


def run(scale: float = 1.0, progress: bool = True) -> dict[str, object]:
    if importlib.util.find_spec("chromadb") is None:
        raise BenchUnavailable(
            "Chroma is not installed: run `make compare-setup` (installs chromadb from "
            "requirements-compare.lock into .venv), then run this benchmark again"
        )
    size = max(1000, int(10_000 * scale))
    single = max(100, int(300 * scale))
    count = max(100, int(300 * scale))
    figures: dict[str, object] = {"records": size}
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("Engram: writes, indexing, search", total=None)
        engram = _engram(size, single, count)
        figures.update(engram)
        for embedder, prefix in SIDES:
            bar.update(task, description=f"Chroma ({embedder} embedder): adds, batches, search")
            chroma = _chroma(embedder, size, single, count)
            figures.update({f"{prefix}_{key}": value for key, value in chroma.items()})
            figures[prefix] = _compare(engram, chroma, size)
    return figures


# Chroma as users get it (its default embedder), then with the shard's embedder.
SIDES = (("shipped", "chroma"), ("engram-int8", "chroma_engram_embedder"))


def _compare(
    engram: dict[str, float], chroma: dict[str, float], size: int
) -> dict[str, object]:
    """The issue's four comparisons against one Chroma run: ratios and whether each is met."""
    writes = max(engram["engram_write_ack_per_s"], engram["engram_write_ack_per_s_64_in_flight"])
    chroma_p95 = chroma[f"search_p95_ms_at_{size}"]
    ratios = {
        "writes_vs_chroma_one_by_one": writes / chroma["add_one_per_s"],
        "indexing_vs_chroma_batch": engram["engram_indexed_records_per_s"]
        / chroma["add_batch_per_s"],
        "search_p95_chroma_over_engram": chroma_p95 / engram[f"engram_hybrid_p95_ms_at_{size}"],
        "search_p95_chroma_over_engram_semantic": chroma_p95
        / engram[f"engram_semantic_p95_ms_at_{size}"],
        "rss_engram_over_chroma": engram[f"engram_rss_mb_at_{size}"] / chroma[f"rss_mb_at_{size}"],
    }
    compared: dict[str, object] = {key: round(value, 2) for key, value in ratios.items()}
    # Reported beside the target: RSS summed over the shard and its embedder process counts
    # the pages they share twice; PSS counts them once (on both sides). None: not readable here.
    engram_pss, chroma_pss = engram.get(f"engram_pss_mb_at_{size}"), chroma.get(f"pss_mb_at_{size}")
    compared["pss_engram_over_chroma"] = (round(engram_pss / chroma_pss, 2)
                                          if engram_pss and chroma_pss else None)
    compared["targets"] = {
        "acknowledged writes >= 30x Chroma's one by one": ratios["writes_vs_chroma_one_by_one"]
        >= 30,
        "semantic indexing >= 2x Chroma's batches": ratios["indexing_vs_chroma_batch"] >= 2,
        "search p95 no higher than Chroma's": ratios["search_p95_chroma_over_engram"] >= 1,
        "less memory than Chroma": ratios["rss_engram_over_chroma"] < 1,
    }
    return compared
