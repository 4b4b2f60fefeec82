"""Chroma's side of `engram bench chroma`, run in its own process so its RSS is its own.

    python -m engram.bench._chroma_side --size 10000 --single 300 --searches 300

Chroma (embedded, persistent, telemetry off) gets the shard's own embedder in-process
(all-MiniLM-L6-v2 on ONNX Runtime, int8, two threads): the same model and the same vectors
as Engram, so the figures compare the stores, not the models. Records and queries come from
`engram bench search`'s generator (same words, same Zipf law, same seed; the texts are drawn,
not replayed, so they match in distribution, not one for one). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from engram.bench._harness import Latency, peak_rss_mb, rss_mb, sequential
from engram.bench.search import CORPUS, SINGLE_WRITE_SERIAL

WARMUP_SERIAL = 70_000_000


def _embedding_function() -> Any:
    from services.shard.retrieval.embedding_onnx import OnnxMiniLMEmbedder

    model = OnnxMiniLMEmbedder(threads=2, int8=True)

    class EngramMiniLM:  # Chroma's EmbeddingFunction protocol (not subclassed: optional import)
        def __init__(self) -> None:
            self.model = model

        def __call__(self, input: list[str]) -> list[Any]:  # Chroma names it "input"
            return list(self.model.embed(list(input)))

        def embed_query(self, input: list[str]) -> list[Any]:  # the base class's default
            return self(input)

        @staticmethod
        def name() -> str:
            return "engram-minilm-int8"

        def get_config(self) -> dict[str, Any]:
            return {}

        @staticmethod
        def build_from_config(config: dict[str, Any]) -> EngramMiniLM:
            return EngramMiniLM()

    return EngramMiniLM()


def measure(size: int, single: int, searches: int) -> dict[str, float]:
    import chromadb
    from chromadb.config import Settings

    corpus = CORPUS  # a fresh process: the generator Engram's side starts from
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="engram-bench-chroma-") as path:
        client = chromadb.PersistentClient(path=path, settings=Settings(anonymized_telemetry=False))
        collection = client.create_collection(
            "bench", embedding_function=_embedding_function(), metadata={"hnsw:space": "cosine"}
        )

        def add_one(serial: int) -> None:
            collection.add(ids=[f"one-{serial}"], documents=[corpus.sentence(serial)])

        for i in range(20):  # warm-up: the first adds build the segment files
            add_one(WARMUP_SERIAL + i)
        began = time.perf_counter()
        one = sequential(lambda i: add_one(SINGLE_WRITE_SERIAL + i), single, warmup=0)
        figures["chroma_add_one_per_s"] = round(single / (time.perf_counter() - began), 1)
        figures["chroma_add_one_p50_ms"], figures["chroma_add_one_p95_ms"] = one.p50_ms, one.p95_ms
        # Batches of 100 up to ``size`` records in all, as Engram's side ingests.
        started, first = time.perf_counter(), collection.count()
        done = first
        while done < size:
            count = min(100, size - done)
            collection.add(
                ids=[f"rec-{done + j}" for j in range(count)],
                documents=[corpus.sentence(done + j) for j in range(count)],
            )
            done += count
        elapsed = time.perf_counter() - started
        figures["chroma_add_batch_per_s"] = round((size - first) / elapsed, 1)
        queries = [" ".join(corpus.words(4)) for _ in range(searches)]
        latency: Latency = sequential(
            lambda i: collection.query(query_texts=[queries[i % searches]], n_results=10),
            searches,
        )
        figures[f"chroma_search_p50_ms_at_{size}"] = latency.p50_ms
        figures[f"chroma_search_p95_ms_at_{size}"] = latency.p95_ms
        figures[f"chroma_rss_mb_at_{size}"] = rss_mb(os.getpid())
        figures["chroma_peak_rss_mb"] = peak_rss_mb(os.getpid())
        figures["chroma_records"] = float(collection.count())
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="records after batch ingest")
    parser.add_argument("--single", type=int, default=300, help="records added one at a time")
    parser.add_argument("--searches", type=int, default=300, help="queries timed")
    args = parser.parse_args(argv)
    json.dump(measure(args.size, args.single, args.searches), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
