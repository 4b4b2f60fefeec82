"""SQLAlchemy tables of the artifacts store; rows convert to domain objects with ``to_entity``.

``artifacts`` is the seed's single table (pointers only, indexes on
``(fleet_id, run_id, step_id)`` and ``hash``); blobs live in the blob store. A run is
known by its fleet and its id: every table that names a run carries both.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Index, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.artifacts.domain.chain import expected_state_hash, tombstone_intact
from services.artifacts.domain.entities import (
    Artifact,
    Event,
    Evidence,
    Manifest,
    Run,
    RunStatus,
    Snapshot,
    SnapshotProblem,
)
from services.common.canonical import canonical_json
from services.common.errors import IntegrityError

JsonType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    pass


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(moment: datetime) -> int:
    """Exact (integer arithmetic: through a float, about 1% of times after 2038 moved by 1 us,
    and an imported artifact then differed from itself)."""
    if moment.tzinfo is None:  # SQLite hands back naive datetimes; they were stored as UTC
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_us(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


class RunRow(Base):
    __tablename__ = "runs"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    stop_reason: Mapped[str] = mapped_column(Text, default="")
    created_us: Mapped[int] = mapped_column(BigInteger)
    stopped_us: Mapped[int] = mapped_column(BigInteger, default=0)
    event_count: Mapped[int] = mapped_column(BigInteger, default=0)
    head_hash: Mapped[str] = mapped_column(String(64), default="")
    latest_snapshot_id: Mapped[str] = mapped_column(String(64), default="")
    metadata_json: Mapped[str] = mapped_column(Text, default="{}")

    __table_args__ = (Index("ix_runs_fleet_created", "fleet_id", "created_us", "run_id"),)

    def to_entity(self) -> Run:
        return Run(run_id=self.run_id, fleet_id=self.fleet_id, agent_id=self.agent_id,
                   status=RunStatus(self.status), stop_reason=self.stop_reason,
                   created_us=self.created_us, stopped_us=self.stopped_us,
                   event_count=self.event_count, head_hash=self.head_hash,
                   latest_snapshot_id=self.latest_snapshot_id, metadata_json=self.metadata_json)


class ArtifactRow(Base):
    __tablename__ = "artifacts"

    artifact_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[str] = mapped_column(String(128))
    step_id: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(512))
    path: Mapped[str] = mapped_column(String(1024))
    hash: Mapped[str] = mapped_column(String(64))
    mime_type: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    metadata_: Mapped[Any] = mapped_column("metadata", JsonType)

    __table_args__ = (
        Index("ix_artifacts_run_step", "fleet_id", "run_id", "step_id"),
        Index("ix_artifacts_hash", "hash"),
        Index("uq_artifacts_path", "path", unique=True),
        Index("uq_artifacts_name", "fleet_id", "run_id", "step_id", "name", unique=True),
    )

    def to_entity(self) -> Artifact:
        return Artifact(artifact_id=self.artifact_id, run_id=self.run_id, step_id=self.step_id,
                        path=self.path, hash=self.hash, mime_type=self.mime_type,
                        size_bytes=self.size_bytes, created_us=to_us(self.created_at),
                        metadata_json=canonical_json(self.metadata_))


class EventRow(Base):
    __tablename__ = "events"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    type: Mapped[str] = mapped_column(String(128))
    payload_json: Mapped[str] = mapped_column(Text)
    manifest_id: Mapped[str] = mapped_column(String(64), default="")
    artifact_ids_json: Mapped[str] = mapped_column(Text, default="[]")
    created_us: Mapped[int] = mapped_column(BigInteger)
    agent_id: Mapped[str] = mapped_column(String(128))
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    format: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    """1 (stored before migration 0004: the hash covers the payload) or 2 (the hash covers
    ``payload_commitment``, SHA-256 of the label, ``salt`` and the payload)."""
    salt: Mapped[str] = mapped_column(String(64), default="", server_default="")
    payload_commitment: Mapped[str] = mapped_column(String(64), default="", server_default="")
    erasure_id: Mapped[str] = mapped_column(String(64), default="", server_default="")
    """Set when erased in place (migration 0005): payload_json and salt are then empty."""
    erased_us: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    erased_by: Mapped[str] = mapped_column(String(128), default="", server_default="")

    __table_args__ = (
        Index("uq_events_run_request", "fleet_id", "run_id", "request_id", unique=True),
    )

    def to_entity(self) -> Event:
        return Event(run_id=self.run_id, seq=self.seq, type=self.type,
                     payload_json=self.payload_json, manifest_id=self.manifest_id,
                     artifact_ids=tuple(json.loads(self.artifact_ids_json)),
                     created_us=self.created_us, agent_id=self.agent_id,
                     prev_hash=self.prev_hash, hash=self.hash, format=self.format,
                     salt=self.salt, payload_commitment=self.payload_commitment,
                     erasure_id=self.erasure_id, erased_us=self.erased_us,
                     erased_by=self.erased_by)


class SnapshotRow(Base):
    __tablename__ = "snapshots"

    snapshot_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[str] = mapped_column(String(128))
    seq: Mapped[int] = mapped_column(BigInteger)
    state_json: Mapped[str] = mapped_column(Text)
    state_hash: Mapped[str] = mapped_column(String(64))
    manifest_id: Mapped[str] = mapped_column(String(64), default="")
    artifact_ids_json: Mapped[str] = mapped_column(Text, default="[]")
    created_us: Mapped[int] = mapped_column(BigInteger)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    format: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    """1 (before migration 0004): state_hash = SHA-256(state); 2: its commitment under salt."""
    salt: Mapped[str] = mapped_column(String(64), default="", server_default="")
    erasure_id: Mapped[str] = mapped_column(String(64), default="", server_default="")
    """Set when erased in place (migration 0005): state_json and salt are then empty."""
    erased_us: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    erased_by: Mapped[str] = mapped_column(String(128), default="", server_default="")

    __table_args__ = (
        Index("ix_snapshots_run_created", "fleet_id", "run_id", "created_us", "snapshot_id"),
        Index("uq_snapshots_run_request", "fleet_id", "run_id", "request_id", unique=True),
    )

    def problem(self) -> SnapshotProblem | None:
        """What is wrong with this stored snapshot (its state re-hashed), or None. A tombstone
        (erased in place) has no state to re-hash: it must be a format-2 one with neither
        state nor salt left, naming an erasure id of governance's form and an erase time."""
        if self.erasure_id:
            actual = self.state_hash if tombstone_intact(
                self.format, self.salt, self.state_json, self.state_hash,
                erasure_id=self.erasure_id, erased_us=self.erased_us) else ""
        else:
            actual = expected_state_hash(self.format, self.salt, self.state_json)
        if actual != self.state_hash:
            return SnapshotProblem(self.snapshot_id, self.run_id, "SNAPSHOT_HASH_MISMATCH",
                                   self.state_hash, actual)
        try:
            ids = json.loads(self.artifact_ids_json)
        except ValueError:
            ids = None
        if not isinstance(ids, list):
            return SnapshotProblem(self.snapshot_id, self.run_id, "SNAPSHOT_UNREADABLE",
                                   self.state_hash, actual)
        return None

    def to_entity(self) -> Snapshot:
        """The snapshot, re-hashed: an altered one is DATA_LOSS naming it, on every read."""
        problem = self.problem()
        if problem is not None:
            raise IntegrityError(
                f"snapshot {self.snapshot_id} of run {self.run_id}: "
                + ("its state no longer matches its hash" if problem.problem ==
                   "SNAPSHOT_HASH_MISMATCH" else "a stored field no longer parses"),
                reason=problem.problem,
                metadata={"snapshot_id": self.snapshot_id, "run_id": self.run_id,
                          "expected": problem.expected_hash, "actual": problem.actual_hash})
        return Snapshot(snapshot_id=self.snapshot_id, run_id=self.run_id, seq=self.seq,
                        state_json=self.state_json, state_hash=self.state_hash,
                        manifest_id=self.manifest_id,
                        artifact_ids=tuple(json.loads(self.artifact_ids_json)),
                        created_us=self.created_us, format=self.format, salt=self.salt,
                        erasure_id=self.erasure_id, erased_us=self.erased_us,
                        erased_by=self.erased_by)


class EvidenceRow(Base):
    __tablename__ = "evidence"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    evidence_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    corpus_id: Mapped[str] = mapped_column(String(128))
    index_id: Mapped[str] = mapped_column(String(128))
    chunk_id: Mapped[str] = mapped_column(String(128))
    span_start: Mapped[int] = mapped_column(BigInteger)
    span_end: Mapped[int] = mapped_column(BigInteger)
    artifact_id: Mapped[str] = mapped_column(String(64), default="")
    metadata_json: Mapped[str] = mapped_column(Text, default="{}")
    created_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_evidence_namespace", "fleet_id", "corpus_id", "index_id", "evidence_id"),
    )

    def to_entity(self) -> Evidence:
        return Evidence(fleet_id=self.fleet_id, evidence_id=self.evidence_id,
                        corpus_id=self.corpus_id, index_id=self.index_id,
                        chunk_id=self.chunk_id, span_start=self.span_start,
                        span_end=self.span_end, artifact_id=self.artifact_id,
                        metadata_json=self.metadata_json, created_us=self.created_us)


class ManifestRow(Base):
    __tablename__ = "manifests"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    manifest_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), default="")
    content_json: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    created_us: Mapped[int] = mapped_column(BigInteger)
    format: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    """1 (before migration 0006): id and content_hash derived from the content; 2: a random
    id and the content's commitment under ``salt``."""
    salt: Mapped[str] = mapped_column(String(64), default="", server_default="")

    __table_args__ = (Index("ix_manifests_fleet_run", "fleet_id", "run_id", "manifest_id"),)

    def to_entity(self) -> Manifest:
        return Manifest(fleet_id=self.fleet_id, manifest_id=self.manifest_id,
                        run_id=self.run_id, content_json=self.content_json,
                        content_hash=self.content_hash, created_us=self.created_us,
                        format=self.format, salt=self.salt)


class ManifestKeyRow(Base):
    """Keyed digest of a fleet's manifest content -> the format-2 manifest it landed on
    (creating the same manifest again answers it); deleted with the manifest."""

    __tablename__ = "manifest_keys"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    manifest_id: Mapped[str] = mapped_column(String(64))

    __table_args__ = (Index("ix_manifest_keys_manifest", "fleet_id", "manifest_id"),)


class FleetSecretRow(Base):
    """A fleet's key for manifest keys (:func:`services.artifacts.domain.chain.manifest_key`)."""

    __tablename__ = "fleet_secrets"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    secret: Mapped[str] = mapped_column(String(64))


class RunTombstoneRow(Base):
    """An erased run (engram forget --run): who ran it, how long its chain was and its head;
    its events, snapshots, artifacts and manifests are gone, and its id is never reused."""

    __tablename__ = "run_tombstones"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(128))
    created_us: Mapped[int] = mapped_column(BigInteger)
    event_count: Mapped[int] = mapped_column(BigInteger)
    head_hash: Mapped[str] = mapped_column(String(64))
    erasure_id: Mapped[str] = mapped_column(String(64))
    erased_us: Mapped[int] = mapped_column(BigInteger)
    erased_by: Mapped[str] = mapped_column(String(128))
    blobs_left_json: Mapped[str] = mapped_column(Text, default="[]")
    """Blob keys still to purge (the rows went first; a rerun of the erasure finishes)."""
