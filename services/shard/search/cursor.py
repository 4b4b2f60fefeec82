"""SeqCursor: follow a table by an increasing sequence without missing late commits.

``records.seq`` is handed out when a row is inserted, not when its transaction
commits. On Postgres (and with several shard replicas writing) a transaction
holding seq 100 can commit after one holding seq 101 has been read, so a plain
``seq > last_seen`` cursor would step over 100 for good. The cursor therefore
remembers the numbers it stepped over (gaps) and asks for them again on every
read until they arrive or grow old; a gap left by a rolled-back transaction (or
a row removed by retention) never fills and is forgotten after ``gap_ttl_s``.
Only the ``max_gaps`` highest stepped-over numbers are kept: a transaction still
in flight holds a recent seq, and the re-read stays one small indexed ``IN``.
SQLite commits one writer at a time, so there gaps only come from rollbacks and
deleted rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class SeqCursor:
    """Not thread-safe: the owner serialises ``advance`` and ``gaps``."""

    def __init__(
        self,
        *,
        gap_ttl_s: float = 60.0,
        max_gaps: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.position = 0  # the highest seq seen
        self._gap_ttl_s = gap_ttl_s
        self._max_gaps = max_gaps
        self._clock = clock
        self._gaps: dict[int, float] = {}  # seq -> when it was first stepped over

    def gaps(self) -> list[int]:
        """Stepped-over seqs still worth asking for, oldest first (expired ones dropped)."""
        if self._gaps:
            oldest_allowed = self._clock() - self._gap_ttl_s
            self._gaps = {s: t for s, t in self._gaps.items() if t >= oldest_allowed}
        return sorted(self._gaps)

    def restore(self, position: int, gaps: Iterable[int]) -> None:
        """Continue from a saved position; its gaps are asked for again (from now on)."""
        now = self._clock()
        self.position = position
        self._gaps = {seq: now for seq in gaps if seq < position}

    def advance(self, seen: Iterable[int]) -> None:
        """Record the seqs a read returned (gap fills and new rows, in any order)."""
        now = self._clock()
        for seq in sorted(seen):
            if seq <= self.position:
                self._gaps.pop(seq, None)
                continue
            for missing in range(max(self.position + 1, seq - self._max_gaps), seq):
                self._gaps[missing] = now
            self.position = seq
        if len(self._gaps) > self._max_gaps:
            for seq in sorted(self._gaps)[: len(self._gaps) - self._max_gaps]:
                del self._gaps[seq]
