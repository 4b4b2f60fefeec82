"""The embedding service's work on /metrics: texts embedded and the time spent, by priority."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.shard.retrieval.embedding import EmbeddingProvider, Vectors


class MeteredEncoder:
    """An :class:`EmbeddingProvider` that counts what passes through it."""

    for_tests_only: bool

    def __init__(self, encoder: EmbeddingProvider) -> None:
        self._encoder = encoder
        self.name = encoder.name
        self.dimension = encoder.dimension
        self.for_tests_only = encoder.for_tests_only
        self._lock = threading.Lock()
        self.texts = {"query": 0.0, "background": 0.0}
        self.seconds = {"query": 0.0, "background": 0.0}

    def _timed(self, priority: str, run: Callable[[Sequence[str]], Vectors],
               texts: Sequence[str]) -> Vectors:
        began = time.perf_counter()
        vectors = run(texts)
        with self._lock:
            self.texts[priority] += len(texts)
            self.seconds[priority] += time.perf_counter() - began
        return vectors

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self._timed("query", self._encoder.embed, texts)

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        return self._timed("background", self._encoder.embed_background, texts)

    def close(self) -> None:
        self._encoder.close()


class EmbedderMetrics(Collector):
    def __init__(self, encoder: MeteredEncoder) -> None:
        self._encoder = encoder

    def collect(self) -> Iterator[Metric]:
        texts = CounterMetricFamily("engram_embedder_texts", "Texts embedded, by priority "
                                    "(query: a search or a duplicate check; background: "
                                    "indexing).", labels=["priority"])
        seconds = CounterMetricFamily("engram_embedder_seconds", "Time spent embedding, by "
                                      "priority.", labels=["priority"])
        for priority in ("query", "background"):
            texts.add_metric([priority], self._encoder.texts[priority])
            seconds.add_metric([priority], self._encoder.seconds[priority])
        yield texts
        yield seconds
        yield GaugeMetricFamily("engram_embedder_dimension", "The model's vector dimension.",
                                value=self._encoder.dimension)
