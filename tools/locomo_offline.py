"""Score the shard's FleetIndex on LoCoMo conversations in-process (no services).

    .venv/bin/python tools/locomo_offline.py /work/shared/data/locomo/*.json [--only NAME]

Each conversation is one FleetIndex (the service's per-fleet index, so the harness and
the service compute the same method), each session one run, each turn one record with
its session date as metadata, added in order; questions are asked with their MiniLM
vector. Figures are printed for all files and separately for the tuning conversations
(``--tune``, default 26 and 30) and the held-out rest. Embeddings of turns are cached
under $TMPDIR so reruns cost only new texts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Protocol

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engram.eval.locomo import Conversation, RecallReport, Turn, load_conversation
from services.shard.retrieval.embedding import BertEmbedder, Vectors
from services.shard.search.fleet_index import ContextSettings, FleetIndex, metadata_day

BEST = ContextSettings()
DATES = replace(BEST, statement_prior=0.0, length_prior=0.0)  # the default before the priors
SYMMETRIC = replace(DATES, before_weight=0.5, after_weight=0.5, distance_decay=1.0, date_boost=0.0)
METHODS: dict[str, tuple[str, ContextSettings]] = {
    "hybrid, neighbours' terms 0.5 both sides": ("hybrid", SYMMETRIC),
    "  + before 0.6 / after 0.4": ("hybrid", replace(DATES, distance_decay=1.0, date_boost=0.0)),
    "  + before 0.7 / after 0.3": (
        "hybrid",
        replace(DATES, before_weight=0.7, after_weight=0.3, distance_decay=1.0, date_boost=0.0),
    ),
    "  + distance 2 at half weight": ("hybrid", replace(SYMMETRIC, distance_decay=0.5)),
    "  + before 0.6 / after 0.4, distance 2 at half": ("hybrid", replace(DATES, date_boost=0.0)),
    "  + dates named in the query": ("hybrid", DATES),
    "  + date boost 0.2": ("hybrid", replace(DATES, date_boost=0.2)),
    "  + date boost 0.1": ("hybrid", replace(DATES, date_boost=0.1)),
    "  + date boost 0.4": ("hybrid", replace(DATES, date_boost=0.4)),
    "  + date boost 0.6": ("hybrid", replace(DATES, date_boost=0.6)),
    "  + statement 0.1, length 0.02 (default)": ("hybrid", BEST),
    "  + statement 0.1 only": ("hybrid", replace(BEST, length_prior=0.0)),
    "  + length 0.02 only": ("hybrid", replace(BEST, statement_prior=0.0)),
    "  + statement 0.05, length 0.02": ("hybrid", replace(BEST, statement_prior=0.05)),
    "  + statement 0.2, length 0.02": ("hybrid", replace(BEST, statement_prior=0.2)),
    "  + statement 0.1, length 0.05": ("hybrid", replace(BEST, length_prior=0.05)),
    "lexical, no date boost": ("lexical", replace(BEST, date_boost=0.0)),
    "lexical (default)": ("lexical", BEST),
    "semantic (default)": ("semantic", BEST),
}


class Embedder(Protocol):
    """What the harness needs of an embedder (the model's, or a probe's precomputed vectors)."""

    dimension: int

    def embed(self, texts: list[str]) -> Vectors: ...


class CachedEmbedder:
    """Wraps the real model with an on-disk cache keyed by text (harness speed only)."""

    def __init__(self) -> None:
        self.model = BertEmbedder()
        self.name, self.dimension = self.model.name, self.model.dimension
        self.path = (
            Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / f"engram-locomo-{self.name}.npz"
        )
        self.cache: dict[str, np.ndarray] = {}
        if self.path.exists():
            with np.load(self.path) as data:
                if "keys" in data.files:
                    self.cache = dict(zip(data["keys"].tolist(), data["vectors"], strict=True))
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
            keys = list(self.cache)
            np.savez(
                self.path, keys=np.array(keys), vectors=np.stack([self.cache[k] for k in keys])
            )


def record_day(turn: Turn) -> date | None:
    """The shard's reading of the metadata the eval writes (the session date)."""
    return metadata_day({"session_date": turn.session_date})


def fleet_of(conv: Conversation, settings: ContextSettings, embedder: Embedder) -> FleetIndex:
    """One conversation as the shard indexes it: records in order, a run per session."""
    index = FleetIndex(embedder.dimension, settings)
    texts = [turn.memory_text() for turn in conv.turns]
    docs = [
        index.add(turn.dia_id, f"session-{turn.session}", text, day=record_day(turn))
        for turn, text in zip(conv.turns, texts, strict=True)
    ]
    index.add_vectors(docs, embedder.embed(texts))
    return index


def evaluate(
    convs: list[Conversation],
    mode: str,
    settings: ContextSettings,
    embedder_of: Callable[[Conversation], Embedder],
    tune: set[str],
) -> dict[str, dict[str, object]]:
    """Recall over all conversations, the tuning ones and the held-out ones; each
    conversation is embedded by ``embedder_of(conversation)``."""
    reports = {name: RecallReport(ks=(5, 10)) for name in ("all", "tune", "held-out")}
    for conv in convs:
        embedder = embedder_of(conv)
        index = fleet_of(conv, settings, embedder)
        vectors = embedder.embed([q.text for q in conv.questions])
        for question, vector in zip(conv.questions, vectors, strict=True):
            start = time.perf_counter()
            found = index.search(question.text, None if mode == "lexical" else vector, mode)
            elapsed = (time.perf_counter() - start) * 1000
            ranked = [index.ids[doc] for doc, _ in found[:10]]
            for name in ("all", "tune" if conv.name in tune else "held-out"):
                reports[name].add(question, ranked, elapsed)
    return {name: report.as_dict() for name, report in reports.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--only", default="")
    parser.add_argument("--tune", default="26,30", help="conversations used to choose methods")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    convs = [load_conversation(f) for f in args.files]
    tune = {name.strip() for name in args.tune.split(",") if name.strip()}
    embedder = CachedEmbedder()
    for conv in convs:  # warm the cache once for every method
        embedder.embed([t.memory_text() for t in conv.turns] + [q.text for q in conv.questions])
    embedder.save()
    for name, (mode, settings) in METHODS.items():
        if args.only and args.only not in name:
            continue
        result = evaluate(convs, mode, settings, lambda _conv: embedder, tune)
        if args.json:
            print(json.dumps({"method": name, **result}))
            continue
        every = result["all"]
        split = " ".join(
            f"{part} {result[part]['recall@5']:.3f}/{result[part]['recall@10']:.3f}"
            for part in ("tune", "held-out")
        )
        cats = " ".join(
            f"{c[:6]}={v['recall@10']:.2f}"
            for c, v in every["categories"].items()  # type: ignore[attr-defined]
        )
        print(
            f"{name:42s} R@5={every['recall@5']:.3f} R@10={every['recall@10']:.3f}  {split}  {cats}"
        )


if __name__ == "__main__":
    main()
