"""Which runs' tier work keeps failing, and when to try each again (exponential backoff).

Tier work (seal a segment, store or retire a snapshot) is redone until it succeeds; a run
whose work fails is tried again later, never in a tight loop, and never stops the work of
other runs. What failed is kept here for operators (VerifyRun, metrics, logs).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class RepairFailure:
    attempts: int
    error: str
    retry_at: float
    """On the clock the caller passes in (monotonic seconds)."""


class RepairBackoff:
    """Failures per run key; after the n-th failure a run waits ``base * 2**(n-1)`` (capped)."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("repair backoff needs 0 < base <= cap")
        self._base, self._cap = base_s, cap_s
        self._failures: dict[tuple[str, str], RepairFailure] = {}
        self._lock = threading.Lock()
        self.total_failures = 0

    def failed(self, key: tuple[str, str], error: str, now: float) -> RepairFailure:
        with self._lock:
            attempts = self._failures[key].attempts + 1 if key in self._failures else 1
            delay = min(self._base * 2 ** min(attempts - 1, 32), self._cap)
            failure = RepairFailure(attempts, error, now + delay)
            self._failures[key] = failure
            self.total_failures += 1
            return failure

    def succeeded(self, key: tuple[str, str]) -> bool:
        """Forget the run's failures; True when it had some."""
        with self._lock:
            return self._failures.pop(key, None) is not None

    def due(self, key: tuple[str, str], now: float) -> bool:
        with self._lock:
            failure = self._failures.get(key)
            return failure is None or failure.retry_at <= now

    def failure(self, key: tuple[str, str]) -> RepairFailure | None:
        with self._lock:
            return self._failures.get(key)

    def failing(self) -> int:
        with self._lock:
            return len(self._failures)
