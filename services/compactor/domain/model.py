"""Domain objects of the compactor store, and the rule that plans one append to a run."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from services.common.errors import FailedPrecondition, InvalidArgument
from services.compactor.domain.blob_layout import SegmentEntry
from services.compactor.domain.warm_chain import IterationInput, WarmLine, genesis_hash


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
class RunView:
    """A run's head and its warm log's parts, all read at one moment (VerifyRun compares them:
    an append or a seal committing between two reads is not a broken log)."""
    head: RunHead
    sealed: list[SegmentEntry]
    line_texts: list[tuple[int, str]]
    """(iteration, stored text) of the lines still in the database."""
    snapshots: list[SnapshotInfo]
    """The stored cold snapshots."""


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
    """The line's ``detailDigest``: a commitment under ``salt`` (format 2), or the detail's
    SHA-256 when ``salt`` is empty (a format-1 line imported as its origin chained it)."""
    request_id: str = ""
    detail_known: bool = True
    """False for an imported iteration whose origin kept only its summary: the warm log gets
    its line, the hot ring and the cold tier nothing (no detail to keep)."""
    expected_hash: str = ""
    """An imported iteration's hash at its origin: the line must come out the same."""
    salt: str = ""
    """The line's salt (format 2); empty for a format-1 line."""
    tombstone: WarmLine | None = None
    """An imported line erased in place at its origin: stored as it is (no detail)."""


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
    tombstones: tuple[WarmLine, ...] = ()
    """Lines checked that are tombstones (erased in place), for the audit against
    governance's erasures."""

    @property
    def tombstoned(self) -> int:
        return len(self.tombstones)

    @property
    def ok(self) -> bool:
        return not self.problems


def plan_append(config: TierConfig, request: AppendRequest,
                head: RunHead | None) -> AppendPlan | None:
    """The append ``request`` makes on top of ``head``; ``None`` when already recorded."""
    fleet_id, run_id, item = request.fleet_id, request.run_id, request.item
    last = head.last_iter if head else 0
    iteration = item.iteration or last + 1
    if iteration <= last:
        return None
    if iteration != last + 1:
        raise FailedPrecondition(
            f"run {run_id} is at iteration {last}; the next one to record is {last + 1}, "
            f"not {iteration}", reason="ITERATION_OUT_OF_ORDER",
            metadata={"next_iteration": str(last + 1)})
    prev = head.head_hash if head else genesis_hash(fleet_id, run_id)
    if request.tombstone is not None:
        line = request.tombstone if request.tombstone.prev_hash == prev else replace(
            request.tombstone, hash="")  # its hash covers another prev_hash: refused below
    else:
        line = WarmLine.chained(item, iteration, prev, request.detail_digest, request.salt)
    if request.expected_hash and line.hash != request.expected_hash:
        raise InvalidArgument(
            f"run {run_id}: imported iteration {iteration} does not hash to its summary's hash "
            "on top of the stored log (altered, or its prev_hash is not the log's head)",
            reason="ITERATION_HASH_MISMATCH", metadata={"iteration": str(iteration)})
    size = len(line.text().encode()) + 1
    seq = head.active_seq if head else 1
    active = head.active_bytes if head else 0
    seal_seq = None
    if active > 0 and active + size > config.rotate_bytes:
        seal_seq, seq, active = seq, seq + 1, 0
    snapshot = request.detail_known and iteration % config.snapshot_every == 0
    return AppendPlan(
        line=line, line_bytes=size, seq=seq, active_bytes=active + size, seal_seq=seal_seq,
        snapshot=snapshot, trim_through=iteration - config.hot_size,
        pending_work=bool(seal_seq is not None or snapshot or (head and head.pending_work)),
    )
