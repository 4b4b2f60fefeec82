"""SQLAlchemy tables of the compactor store; rows convert to domain objects with ``to_entity``.

The database holds what must change transactionally (run heads, the hot ring,
the active warm segment's lines, snapshot and segment bookkeeping, pins, policy
runs); sealed segments, index files and cold snapshots live in the blob store.
"""

from __future__ import annotations

import json

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.compactor.domain.blob_layout import SegmentEntry
from services.compactor.domain.memory_policy import CompactedGroup, PolicyRun
from services.compactor.domain.model import HotEntry, Pin, SnapshotInfo, SnapshotState
from services.compactor.domain.warm_chain import WarmLine


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "compactor_runs"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    last_iter: Mapped[int] = mapped_column(BigInteger)
    head_hash: Mapped[str] = mapped_column(String(64))
    active_seq: Mapped[int] = mapped_column(Integer)
    active_bytes: Mapped[int] = mapped_column(BigInteger)
    index_version: Mapped[int] = mapped_column(Integer, default=0)
    pending_work: Mapped[bool] = mapped_column(Boolean, default=False)
    created_us: Mapped[int] = mapped_column(BigInteger)
    updated_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_compactor_runs_pending", "pending_work"),)


class WarmLineRow(Base):
    """Lines of the active segment and of segments being sealed."""

    __tablename__ = "compactor_warm_lines"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    iteration: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    line: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_compactor_warm_lines_seq", "fleet_id", "run_id", "seq"),)

    def to_entity(self) -> WarmLine:
        return WarmLine.parse(self.line)


class IterationRequestRow(Base):
    """Which iteration a RecordIteration request_id recorded (a retry returns it)."""

    __tablename__ = "compactor_iteration_requests"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    iteration: Mapped[int] = mapped_column(BigInteger)


class HotRow(Base):
    __tablename__ = "compactor_hot"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    iteration: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    line: Mapped[str] = mapped_column(Text)
    detail_json: Mapped[str] = mapped_column(Text)
    guardrails_json: Mapped[str] = mapped_column(Text)

    def to_entity(self) -> HotEntry:
        return HotEntry(WarmLine.parse(self.line), self.detail_json, self.guardrails_json)


class SegmentRow(Base):
    __tablename__ = "compactor_segments"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    sealed: Mapped[bool] = mapped_column(Boolean, default=False)
    key: Mapped[str] = mapped_column(String(512), default="")
    first_iter: Mapped[int] = mapped_column(BigInteger, default=0)
    last_iter: Mapped[int] = mapped_column(BigInteger, default=0)
    lines: Mapped[int] = mapped_column(Integer, default=0)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str] = mapped_column(String(64), default="")
    first_prev_hash: Mapped[str] = mapped_column(String(64), default="")
    last_hash: Mapped[str] = mapped_column(String(64), default="")

    def to_entry(self) -> SegmentEntry:
        return SegmentEntry(seq=self.seq, key=self.key, first_iter=self.first_iter,
                            last_iter=self.last_iter, lines=self.lines, bytes=self.size_bytes,
                            sha256=self.sha256, first_prev_hash=self.first_prev_hash,
                            last_hash=self.last_hash)


class SnapshotRow(Base):
    __tablename__ = "compactor_snapshots"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    iteration: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(512))
    sha256: Mapped[str] = mapped_column(String(64), default="")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (Index("ix_compactor_snapshots_state", "fleet_id", "run_id", "state"),)

    def to_entity(self) -> SnapshotInfo:
        return SnapshotInfo(self.iteration, SnapshotState(self.state), self.key, self.sha256,
                            self.size_bytes)


class PinRow(Base):
    __tablename__ = "compactor_pins"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    iteration: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    snapshot_iteration: Mapped[int] = mapped_column(BigInteger)
    created_us: Mapped[int] = mapped_column(BigInteger)

    def to_entity(self) -> Pin:
        return Pin(self.iteration, self.reason, self.snapshot_iteration, self.created_us)


class PolicyRunRow(Base):
    __tablename__ = "compactor_policy_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    dry_run: Mapped[bool] = mapped_column(Boolean)
    trigger: Mapped[str] = mapped_column(String(128))
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str] = mapped_column(Text)
    examined: Mapped[int] = mapped_column(BigInteger)
    compacted: Mapped[int] = mapped_column(BigInteger)
    groups_json: Mapped[str] = mapped_column(Text)
    removed_ids_json: Mapped[str] = mapped_column(Text)
    importance_below: Mapped[float] = mapped_column(Float)
    older_than_days: Mapped[float] = mapped_column(Float)
    start_us: Mapped[int] = mapped_column(BigInteger)
    end_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_compactor_policy_runs_fleet", "fleet_id", "start_us", "id"),)

    @classmethod
    def from_entity(cls, run: PolicyRun) -> PolicyRunRow:
        groups = [{"summary_id": g.summary_id, "replaced_ids": list(g.replaced_ids),
                   "replaced_hashes": list(g.replaced_hashes), "domain": g.domain,
                   "run_id": g.run_id} for g in run.groups]
        return cls(id=run.id, fleet_id=run.fleet_id, kind=run.kind, dry_run=run.dry_run,
                   trigger=run.trigger, outcome=run.outcome, error=run.error,
                   examined=run.examined, compacted=run.compacted,
                   groups_json=json.dumps(groups), removed_ids_json=json.dumps(
                       list(run.removed_ids)),
                   importance_below=run.importance_below, older_than_days=run.older_than_days,
                   start_us=run.start_us, end_us=run.end_us)

    def to_entity(self) -> PolicyRun:
        groups = tuple(
            CompactedGroup(g["summary_id"], tuple(g["replaced_ids"]),
                           tuple(g["replaced_hashes"]), g["domain"], g["run_id"])
            for g in json.loads(self.groups_json))
        return PolicyRun(
            id=self.id, fleet_id=self.fleet_id, kind=self.kind, dry_run=self.dry_run,
            trigger=self.trigger, outcome=self.outcome, error=self.error,
            examined=self.examined, compacted=self.compacted, groups=groups,
            removed_ids=tuple(json.loads(self.removed_ids_json)),
            importance_below=self.importance_below, older_than_days=self.older_than_days,
            start_us=self.start_us, end_us=self.end_us,
        )


class RunTombstoneRow(Base):
    """A run whose iteration log was erased (engram forget --run); nothing is recorded to it
    again."""

    __tablename__ = "compactor_run_tombstones"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    last_iter: Mapped[int] = mapped_column(BigInteger)
    head_hash: Mapped[str] = mapped_column(String(64))
    erasure_id: Mapped[str] = mapped_column(String(64))
    erased_us: Mapped[int] = mapped_column(BigInteger)
    erased_by: Mapped[str] = mapped_column(String(128))
    blobs_left: Mapped[bool] = mapped_column(Boolean, default=True)
    """The run's blobs may still be stored (rows go first; a rerun of the erasure finishes)."""
