"""Memory compaction and retention policy runs (seed 001 roadmap), asked of the shard.

The shard owns memory records, so the compactor only decides *when* and with
which thresholds, calls the shard through :class:`MemoryCompactionPort`, and
records every run (what was examined, compacted, which summary ids, what was
removed) so no policy acts silently. A failed call is recorded too, then raised.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.common.errors import EngramError, InvalidArgument

DEFAULT_IMPORTANCE_BELOW = 0.3
DEFAULT_OLDER_THAN_DAYS = 30.0
KIND_COMPACT = "compact"
KIND_RETENTION = "retention"


@dataclass(frozen=True)
class CompactedGroup:
    summary_id: str
    replaced_ids: tuple[str, ...]
    replaced_hashes: tuple[str, ...]
    domain: str
    run_id: str


@dataclass(frozen=True)
class CompactionOutcome:
    examined: int
    compacted: int
    groups: tuple[CompactedGroup, ...]


@dataclass(frozen=True)
class PolicyRun:
    id: str
    fleet_id: str
    kind: str
    dry_run: bool
    trigger: str
    outcome: str
    error: str
    examined: int
    compacted: int
    groups: tuple[CompactedGroup, ...]
    removed_ids: tuple[str, ...]
    importance_below: float
    older_than_days: float
    start_us: int
    end_us: int


class MemoryCompactionPort(Protocol):
    def compact(self, fleet_id: str, importance_below: float, older_than_days: float,
                dry_run: bool) -> CompactionOutcome:
        """Raises ``Unavailable`` when the shard cannot be reached."""

    def apply_retention(self, fleet_id: str, older_than_days: float,
                        dry_run: bool) -> Sequence[str]:
        """The removed (or, in a dry run, removable) record ids."""


class PolicyRunStore(Protocol):
    def save_policy_run(self, run: PolicyRun) -> None: ...


def _now_us() -> int:
    return time.time_ns() // 1000


class MemoryPolicyRunner:
    def __init__(self, port: MemoryCompactionPort, store: PolicyRunStore) -> None:
        self._port = port
        self._store = store

    def compact(self, fleet_id: str, trigger: str, *, dry_run: bool,
                importance_below: float | None = None,
                older_than_days: float | None = None) -> PolicyRun:
        below = DEFAULT_IMPORTANCE_BELOW if importance_below is None else importance_below
        days = DEFAULT_OLDER_THAN_DAYS if older_than_days is None else older_than_days
        if not 0.0 < below <= 1.0:
            raise InvalidArgument(f"importance_below must be in (0, 1], got {below}")
        if days < 0:
            raise InvalidArgument(f"older_than_days must be >= 0, got {days}")
        start = _now_us()
        try:
            outcome = self._port.compact(fleet_id, below, days, dry_run)
        except EngramError as error:
            self._store.save_policy_run(self._failed(KIND_COMPACT, fleet_id, trigger, dry_run,
                                                     below, days, start, error))
            raise
        run = PolicyRun(
            id=uuid.uuid4().hex, fleet_id=fleet_id, kind=KIND_COMPACT, dry_run=dry_run,
            trigger=trigger, outcome="succeeded", error="", examined=outcome.examined,
            compacted=outcome.compacted, groups=outcome.groups, removed_ids=(),
            importance_below=below, older_than_days=days, start_us=start, end_us=_now_us(),
        )
        self._store.save_policy_run(run)
        return run

    def apply_retention(self, fleet_id: str, trigger: str, *, older_than_days: float,
                        dry_run: bool) -> PolicyRun:
        if older_than_days <= 0:
            raise InvalidArgument(
                f"older_than_days must be > 0 for retention, got {older_than_days}: "
                "removing originals is explicit and needs an age")
        start = _now_us()
        try:
            removed = tuple(self._port.apply_retention(fleet_id, older_than_days, dry_run))
        except EngramError as error:
            self._store.save_policy_run(self._failed(KIND_RETENTION, fleet_id, trigger, dry_run,
                                                     0.0, older_than_days, start, error))
            raise
        run = PolicyRun(
            id=uuid.uuid4().hex, fleet_id=fleet_id, kind=KIND_RETENTION, dry_run=dry_run,
            trigger=trigger, outcome="succeeded", error="", examined=len(removed), compacted=0,
            groups=(), removed_ids=removed, importance_below=0.0,
            older_than_days=older_than_days, start_us=start, end_us=_now_us(),
        )
        self._store.save_policy_run(run)
        return run

    @staticmethod
    def _failed(kind: str, fleet_id: str, trigger: str, dry_run: bool, below: float,
                days: float, start: int, error: EngramError) -> PolicyRun:
        return PolicyRun(
            id=uuid.uuid4().hex, fleet_id=fleet_id, kind=kind, dry_run=dry_run, trigger=trigger,
            outcome="failed", error=f"{error.code}: {error.message}", examined=0, compacted=0,
            groups=(), removed_ids=(), importance_below=below, older_than_days=days,
            start_us=start, end_us=_now_us(),
        )
