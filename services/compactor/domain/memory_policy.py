"""What a memory compaction or retention policy run did (seed 001 roadmap), as recorded.

The shard owns memory records; the compactor decides when and with which thresholds, asks
the shard, and records every run (what was examined, compacted, which summary ids, what was
removed) so no policy acts silently.
"""

from __future__ import annotations

from dataclasses import dataclass

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
