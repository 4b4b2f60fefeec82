"""Prometheus metrics: the standard ``grpc_server_*`` families plus a domain registry.

Every server has its own :class:`CollectorRegistry` so several servers can run
in one process (tests) without clashing; ``/metrics`` is served on a separate
port when ``metrics_port`` is set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True)
class _MethodMetrics:
    started_counter: Counter
    handled_counter: Counter
    seconds: Histogram
    labels: tuple[str, str, str]

    def started(self) -> None:
        self.started_counter.labels(*self.labels).inc()

    def handled(self, code: str, seconds: float) -> None:
        self.handled_counter.labels(*self.labels, code).inc()
        self.seconds.labels(*self.labels).observe(seconds)


class GrpcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        base = ("grpc_type", "grpc_service", "grpc_method")
        self._started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", base, registry=registry
        )
        self._handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, regardless of success or failure.",
            (*base, "grpc_code"),
            registry=registry,
        )
        self._seconds = Histogram(
            "grpc_server_handling_seconds",
            "Response latency of RPCs handled by the server.",
            base,
            buckets=_BUCKETS,
            registry=registry,
        )

    def for_method(self, full_method: str, grpc_type: str) -> _MethodMetrics:
        service, _, method = full_method.lstrip("/").partition("/")
        return _MethodMetrics(
            self._started, self._handled, self._seconds, (grpc_type, service, method)
        )


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> int:
    """Start the ``/metrics`` HTTP endpoint; return the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)


class Tally:
    """Counts by label values, kept by domain code (which never imports prometheus) and read
    by a collector at scrape time. Thread-safe; label values must be few (kinds, outcomes),
    never ids."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], float] = {}

    def add(self, *labels: str, amount: float = 1.0) -> None:
        if amount:
            with self._lock:
                self._counts[labels] = self._counts.get(labels, 0.0) + amount

    def items(self) -> list[tuple[tuple[str, ...], float]]:
        with self._lock:
            return list(self._counts.items())


def counter(name: str, documentation: str, labels: Iterable[str],
            tally: Tally, known: Iterable[tuple[str, ...]] = ()) -> CounterMetricFamily:
    """A counter family (``name`` without ``_total``) from a tally; the ``known`` label
    values are exported at 0 until counted, so a rate sees their first count."""
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    counts = dict.fromkeys(known, 0.0)
    counts.update(tally.items())
    for values, amount in counts.items():
        family.add_metric(list(values), amount)
    return family


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
