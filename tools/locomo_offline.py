"""Score ranking methods on LoCoMo conversations in-process (no services), for quick iteration.

    .venv/bin/python tools/locomo_offline.py /work/shared/data/locomo/*.json [--only NAME]

Embeddings of turns are cached under $TMPDIR so reruns cost only the queries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engram.eval.locomo import Conversation, RecallReport, load_conversation
from services.shard.retrieval.embedding import MiniLMEmbedder, Vectors
from services.shard.retrieval.ranking import HybridRanker, Memory, RankingConfig

PLAIN = RankingConfig(
    stemming=False,
    stop_words=False,
    neighbour_weight=0.0,
    neighbour_window=1,
    dense_neighbour_weight=0.0,
    fusion="rrf",
    smoothing=0.0,
    bm25_k1=1.2,
    bm25_b=0.75,
)
ANALYSED = replace(PLAIN, stemming=True, stop_words=True)
CONTEXT = replace(ANALYSED, neighbour_weight=0.5, dense_neighbour_weight=0.3)
BEST = RankingConfig()
METHODS: dict[str, RankingConfig] = {
    "bm25 plain": replace(PLAIN, mode="lexical"),
    "dense MiniLM": replace(PLAIN, mode="semantic"),
    "rrf plain": PLAIN,
    "bm25 +stem+stop": replace(ANALYSED, mode="lexical"),
    "bm25 +neighbours (w 0.5, window 1)": replace(CONTEXT, mode="lexical"),
    "dense +neighbour blend 0.3": replace(CONTEXT, mode="semantic"),
    "rrf +context": CONTEXT,
    "convex +context": replace(CONTEXT, fusion="convex"),
    "convex +context window 2": replace(CONTEXT, fusion="convex", neighbour_window=2),
    "  + smoothing 0.2": replace(BEST, bm25_k1=1.2, bm25_b=0.75),
    "  + bm25 k1 0.9 b 0.4 (default)": BEST,
    "  + lexical prf 3 docs": replace(BEST, prf_docs=3),
    "  + dense rocchio 0.5": replace(BEST, dense_prf=0.5),
    "  + thread (session) score 0.3": replace(BEST, thread_weight=0.3),
    "  + speaker boost 0.5": replace(BEST, speaker_boost=0.5),
    "  + window text embedded": replace(BEST, dense_window_text=True, dense_neighbour_weight=0.0),
    "  context as scores (service)": replace(
        BEST, context_level="scores", dense_context_level="scores"
    ),
    "  lexical terms, dense scores (service)": replace(BEST, dense_context_level="scores"),
    "  lexical terms, no dense blend": replace(BEST, dense_neighbour_weight=0.0),
    "  context as scores, no dense blend": replace(
        BEST, context_level="scores", dense_neighbour_weight=0.0
    ),
    "  context as scores, lexical": replace(BEST, context_level="scores", mode="lexical"),
    "lexical (default)": replace(BEST, mode="lexical"),
    "semantic (default)": replace(BEST, mode="semantic"),
}


class CachedEmbedder:
    """Wraps the real model with an on-disk cache keyed by text (harness speed only)."""

    def __init__(self) -> None:
        self.model = MiniLMEmbedder()
        self.name, self.dimension, self.for_tests_only = self.model.name, 384, False
        self.path = Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / "engram-locomo-emb.npz"
        self.cache: dict[str, np.ndarray] = {}
        if self.path.exists():
            with np.load(self.path) as data:
                self.cache = {k: data[k] for k in data.files}
        self.dirty = False

    def embed(self, texts: list[str]) -> Vectors:
        keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
        missing = [t for t, k in zip(texts, keys, strict=True) if k not in self.cache]
        if missing:
            for t, v in zip(missing, self.model.embed(missing), strict=True):
                self.cache[hashlib.sha1(t.encode()).hexdigest()] = v
            self.dirty = True
        return np.stack([self.cache[k] for k in keys]).astype(np.float32)

    def save(self) -> None:
        if self.dirty:
            np.savez(self.path, **self.cache)


def memories_of(conv: Conversation) -> list[Memory]:
    return [
        Memory(t.memory_text(), speaker=t.speaker, thread=f"session-{t.session}", position=t.index)
        for t in conv.turns
    ]


def evaluate(convs: list[Conversation], config: RankingConfig, embedder: CachedEmbedder) -> dict:
    report = RecallReport(ks=(5, 10))
    for conv in convs:
        ranker = HybridRanker(memories_of(conv), embedder, config)
        for q in conv.questions:
            start = time.perf_counter()
            ranked = [conv.turns[i].dia_id for i in ranker.search(q.text, 10)]
            report.add(q, ranked, (time.perf_counter() - start) * 1000)
    return report.as_dict()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--only", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    convs = [load_conversation(f) for f in args.files]
    embedder = CachedEmbedder()
    for conv in convs:  # warm the cache once for every method
        embedder.embed([m.text for m in memories_of(conv)] + [q.text for q in conv.questions])
    embedder.save()
    for name, config in METHODS.items():
        if args.only and args.only not in name:
            continue
        result = evaluate(convs, config, embedder)
        if args.json:
            print(json.dumps({"method": name, **result}))
        else:
            cats = " ".join(
                f"{c[:6]}={v['recall@10']:.2f}" for c, v in result["categories"].items()
            )
            print(f"{name:40s} R@5={result['recall@5']:.3f} R@10={result['recall@10']:.3f}  {cats}")


if __name__ == "__main__":
    main()
