"""Domain objects of the compactor store (no SQLAlchemy, no grpc)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from services.compactor.warm_chain import IterationInput, WarmLine


@dataclass(frozen=True)
class TierConfig:
    """Seed 003's knobs; every default is a setting."""

    hot_size: int = 10
    rotate_bytes: int = 5 * 1024 * 1024
    snapshot_every: int = 25
    keep_snapshots: int = 10


@dataclass(frozen=True)
class RunHead:
    fleet_id: str
    run_id: str
    last_iter: int
    head_hash: str
    active_seq: int
    active_bytes: int
    index_version: int
    pending_work: bool


@dataclass(frozen=True)
class HotEntry:
    line: WarmLine
    detail_json: str
    guardrails_json: str


class SnapshotState(enum.StrEnum):
    PENDING = "pending"
    STORED = "stored"
    RETIRING = "retiring"


@dataclass(frozen=True)
class SnapshotInfo:
    iteration: int
    state: SnapshotState
    key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class Pin:
    iteration: int
    reason: str
    snapshot_iteration: int
    created_us: int


@dataclass(frozen=True)
class AppendPlan:
    """What one append changes, decided from the run's head inside the transaction."""

    line: WarmLine
    line_bytes: int
    seq: int
    active_bytes: int
    seal_seq: int | None
    snapshot: bool
    trim_through: int
    pending_work: bool


@dataclass(frozen=True)
class AppendRequest:
    """One caller's iteration waiting for the group commit; ``item`` is already validated."""

    fleet_id: str
    run_id: str
    item: IterationInput
    detail_digest: str
    request_id: str = ""


@dataclass(frozen=True)
class AppendOutcome:
    """What the group transaction did with one request.

    ``plan`` is set when the iteration was appended; ``None`` with no ``error`` and no
    ``retry`` means the iteration was already recorded (``recorded_iteration`` says which
    when the request's request_id had recorded it). ``head_pending`` says the run had
    unfinished tier work when the transaction read its head.
    """

    plan: AppendPlan | None
    head_pending: bool
    retry: bool = False
    error: Exception | None = None
    recorded_iteration: int = 0


class DetailSource(enum.Enum):
    HOT = "hot"
    COLD_SNAPSHOT = "cold_snapshot"
    BASE_SNAPSHOT = "base_snapshot"
    SUMMARY_ONLY = "summary_only"


@dataclass(frozen=True)
class Reconstruction:
    summary: WarmLine
    source: DetailSource
    detail_json: str = ""
    guardrails_json: str = ""
    base_iteration: int = 0
    trail: tuple[WarmLine, ...] = ()


@dataclass(frozen=True)
class VerifyReport:
    lines_checked: int
    segments_checked: int
    snapshots_checked: int
    last_iteration: int
    head_hash: str
    problems: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems
