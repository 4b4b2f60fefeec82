"""Hybrid ranking over one fleet's memories: BM25 + dense, fused, with context craft.

A ``Memory`` is one record as ranking sees it (text, speaker/author, the thread
it belongs to and its position there). ``HybridRanker`` builds a lexical index
(a memory's terms plus its thread neighbours' at a lower weight) and a dense
matrix (a memory's vector blended with its neighbours'), and answers a query
with scores for every memory. Each craft step is a switch in ``RankingConfig``
so its effect can be measured (tools/locomo_offline.py, docs/retrieval.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.shard.retrieval.embedding import EmbeddingProvider, Vectors
from services.shard.retrieval.fusion import convex_fusion, min_max, reciprocal_rank_fusion, top_k
from services.shard.retrieval.lexical import BM25Index
from services.shard.retrieval.text import STOP_WORDS, analyze, tokenize

Scores = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Memory:
    text: str
    speaker: str = ""
    thread: str = ""  # records of one conversation/session/run, in order
    position: int = 0


@dataclass(frozen=True)
class RankingConfig:
    """Defaults are the best general setting measured on LoCoMo (docs/retrieval.md)."""

    mode: str = "hybrid"  # lexical | semantic | hybrid
    stemming: bool = True
    stop_words: bool = True
    neighbour_weight: float = 0.5  # weight of thread neighbours' terms in a memory's lexical doc
    neighbour_window: int = 2
    neighbour_decay: float = 1.0  # weight multiplier per extra step of distance
    bm25_k1: float = 0.9
    bm25_b: float = 0.4
    dense_prf: float = 0.0  # Rocchio: share of the top fused memories' mean added to the query
    dense_neighbour_weight: float = 0.3  # share of neighbours' mean vector in a memory's vector
    fusion: str = "convex"  # rrf | convex
    rrf_k: float = 60.0
    lexical_weight: float = 0.5  # for convex fusion (dense gets 1 - this)
    smoothing: float = 0.2  # share of neighbours' final score added to a memory's
    prf_docs: int = 0  # pseudo-relevance feedback: top docs to expand from (0 = off)
    prf_terms: int = 10
    prf_weight: float = 0.5
    speaker_boost: float = 0.0  # multiplier bonus when the query names the memory's speaker
    thread_weight: float = 0.0  # share of the memory's whole-thread BM25 score (normalised) added
    dense_window_text: bool = False  # embed a memory together with its neighbours' text
    depth: int = 100  # candidates taken from each list before fusion
    context_level: str = "terms"  # terms: neighbours' terms in the doc; scores: their scores
    dense_context_level: str = "vectors"  # vectors: blended vectors; scores: blended similarities


class HybridRanker:
    def __init__(
        self,
        memories: Sequence[Memory],
        embedder: EmbeddingProvider | None,
        config: RankingConfig,
        *,
        vectors: Vectors | None = None,
    ) -> None:
        self.memories = list(memories)
        self.config = config
        self._embedder = embedder
        stops = STOP_WORDS if config.stop_words else frozenset()
        self._stops: frozenset[str] = stops
        own_terms = [Counter(self._analyze(m.text)) for m in self.memories]
        self._neighbours = self._thread_neighbours(config.neighbour_window)
        self.lexical = BM25Index(k1=config.bm25_k1, b=config.bm25_b)
        for i, terms in enumerate(own_terms):
            doc: dict[str, float] = {t: float(c) for t, c in terms.items()}
            if config.neighbour_weight > 0 and config.context_level == "terms":
                for j in self._neighbours[i]:
                    distance = abs(self.memories[j].position - self.memories[i].position)
                    weight = config.neighbour_weight * config.neighbour_decay ** max(
                        0, distance - 1
                    )
                    for term, count in own_terms[j].items():
                        doc[term] = doc.get(term, 0.0) + weight * count
            self.lexical.add(doc)
        self._thread_of: list[int] = []
        self.threads = BM25Index()
        if config.thread_weight > 0:
            thread_ids: dict[str, int] = {}
            thread_terms: list[Counter[str]] = []
            for i, m in enumerate(self.memories):
                if m.thread not in thread_ids:
                    thread_ids[m.thread] = len(thread_terms)
                    thread_terms.append(Counter())
                self._thread_of.append(thread_ids[m.thread])
                thread_terms[thread_ids[m.thread]].update(own_terms[i])
            for bag in thread_terms:
                self.threads.add(bag)
        self.vectors: Vectors | None = None
        if config.mode != "lexical" and embedder is not None:
            if config.dense_window_text:
                texts = [
                    " ".join(self.memories[j].text for j in sorted([i, *self._neighbours[i]]))
                    for i in range(len(self.memories))
                ]
                base = embedder.embed(texts)
            else:
                base = (
                    vectors
                    if vectors is not None
                    else embedder.embed([m.text for m in self.memories])
                )
            self.vectors = self._blend(
                base,
                config.dense_neighbour_weight if config.dense_context_level == "vectors" else 0.0,
            )
        self._speakers = {m.speaker.lower() for m in self.memories if m.speaker}

    def _thread_neighbours(self, window: int) -> list[list[int]]:
        by_thread: dict[str, list[int]] = {}
        for i, m in enumerate(self.memories):
            by_thread.setdefault(m.thread, []).append(i)
        out: list[list[int]] = [[] for _ in self.memories]
        for members in by_thread.values():
            members.sort(key=lambda i: self.memories[i].position)
            for pos, i in enumerate(members):
                lo, hi = max(0, pos - window), min(len(members), pos + window + 1)
                out[i] = [members[p] for p in range(lo, hi) if p != pos]
        return out

    def _blend(self, base: Vectors, weight: float) -> Vectors:
        if weight <= 0:
            return base
        blended = np.empty_like(base)
        for i, neighbours in enumerate(self._neighbours):
            context = base[neighbours].mean(axis=0) if neighbours else base[i]
            blended[i] = (1.0 - weight) * base[i] + weight * context
        norms = np.linalg.norm(blended, axis=1, keepdims=True)
        out: Vectors = (blended / np.maximum(norms, 1e-12)).astype(np.float32)
        return out

    def _analyze(self, text: str) -> list[str]:
        return analyze(text, stop_words=self._stops, stemming=self.config.stemming)

    def lexical_scores(self, query: str) -> Scores:
        terms: dict[str, float] = {t: float(c) for t, c in Counter(self._analyze(query)).items()}
        scores = self.lexical.scores(terms)
        cfg = self.config
        if cfg.prf_docs > 0 and len(self.memories) > cfg.prf_docs:
            expansion: dict[str, float] = {}
            for rank, doc in enumerate(top_k(scores, cfg.prf_docs)):
                doc_terms = Counter(self._analyze(self.memories[doc].text))
                total = sum(doc_terms.values()) or 1
                for term, count in doc_terms.items():
                    expansion[term] = expansion.get(term, 0.0) + (count / total) / (rank + 1)
            for term in terms:
                expansion.pop(term, None)
            best = sorted(expansion.items(), key=lambda tw: -tw[1])[: cfg.prf_terms]
            expanded = dict(terms)
            for term, weight in _normalised(best):
                expanded[term] = cfg.prf_weight * weight
            scores = self.lexical.scores(expanded)
        if cfg.context_level == "scores" and cfg.neighbour_weight > 0:
            scores = scores + cfg.neighbour_weight * self._neighbour_sum(scores)
        return scores

    def _neighbour_sum(self, scores: Scores) -> Scores:
        out = np.zeros_like(scores)
        for i, neighbours in enumerate(self._neighbours):
            if neighbours:
                out[i] = scores[neighbours].sum()
        return out

    def semantic_scores(self, query: str, feedback: Sequence[int] = ()) -> Scores:
        if self.vectors is None or self._embedder is None:
            return np.zeros(len(self.memories), dtype=np.float32)
        q = self._embedder.embed([query])[0]
        if feedback:
            q = q + self.config.dense_prf * self.vectors[list(feedback)].mean(axis=0)
        sims: Scores = (self.vectors @ q).astype(np.float32)
        weight = self.config.dense_neighbour_weight
        if self.config.dense_context_level == "scores" and weight > 0:
            counts = np.array([max(1, len(n)) for n in self._neighbours], dtype=np.float32)
            sims = (1.0 - weight) * sims + weight * self._neighbour_sum(sims) / counts
        return sims

    def scores(self, query: str) -> Scores:
        cfg = self.config
        n = len(self.memories)
        if cfg.mode == "lexical":
            final = self.lexical_scores(query)
        elif cfg.mode == "semantic":
            final = self.semantic_scores(query)
        else:
            lex, sem = self.lexical_scores(query), self.semantic_scores(query)
            if cfg.fusion == "convex":
                final = convex_fusion([(cfg.lexical_weight, lex), (1.0 - cfg.lexical_weight, sem)])
                if cfg.dense_prf > 0:
                    sem = self.semantic_scores(query, top_k(final, 3))
                    final = convex_fusion(
                        [(cfg.lexical_weight, lex), (1.0 - cfg.lexical_weight, sem)]
                    )
            else:
                lists = [[i for i in top_k(s, cfg.depth) if s[i] > 0] for s in (lex, sem)]
                fused = reciprocal_rank_fusion(lists, k=cfg.rrf_k)
                final = np.zeros(n, dtype=np.float32)
                for doc, value in fused.items():
                    final[doc] = value
        if cfg.thread_weight > 0 and len(self.threads):
            thread_scores = min_max(self.threads.scores(Counter(self._analyze(query))))
            final = min_max(final) + cfg.thread_weight * thread_scores[self._thread_of]
        if cfg.smoothing > 0:
            base = min_max(final)
            smoothed = base.copy()
            for i, neighbours in enumerate(self._neighbours):
                if neighbours:
                    smoothed[i] += cfg.smoothing * float(base[neighbours].max())
            final = smoothed
        if cfg.speaker_boost > 0:
            named = self._speakers.intersection(tokenize(query))
            if named:
                boost = np.array(
                    [
                        1.0 + cfg.speaker_boost if m.speaker.lower() in named else 1.0
                        for m in self.memories
                    ],
                    dtype=np.float32,
                )
                final = min_max(final) * boost
        return final

    def search(self, query: str, k: int) -> list[int]:
        return top_k(self.scores(query), k)


def _normalised(items: list[tuple[str, float]]) -> list[tuple[str, float]]:
    top = items[0][1] if items else 1.0
    return [(t, w / top) for t, w in items]
