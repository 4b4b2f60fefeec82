"""Stop semantics (seed 004): a critical pointer is retried once, then the run stops.

The resolver only decides; the caller supplies the lookup and the stop action,
so the rule is testable without storage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from services.artifacts.domain.entities import Pointer, Resolution
from services.common.canonical import canonical_json

STOP_EVENT_TYPE = "run.stopped"


@dataclass(frozen=True)
class Outcome:
    resolution: Resolution
    attempts: int


class PointerResolver:
    def __init__(self, lookup: Callable[[Pointer], Resolution], retry_delay_s: float = 0.05,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._lookup = lookup
        self._retry_delay_s = retry_delay_s
        self._sleep = sleep

    def resolve(self, pointer: Pointer, critical: bool) -> Outcome:
        """Non-critical pointers get one attempt; critical ones a retry for transient I/O."""
        first = self._lookup(pointer)
        if first.resolved or not critical:
            return Outcome(first, 1)
        self._sleep(self._retry_delay_s)
        second = self._lookup(pointer)
        return Outcome(second if second.resolved or second.path or second.hash else first, 2)


def unresolved_payload(pointer: Pointer, resolution: Resolution, attempts: int) -> str:
    """The stop event's payload: names the pointer's type, id, path and hash."""
    return canonical_json({
        "status": "SYSTEM_ERROR",
        "reason": "critical pointer unresolved",
        "pointer": {"type": pointer.type.value, "id": pointer.id, "path": resolution.path,
                    "hash": resolution.hash},
        "attempts": attempts,
    })
