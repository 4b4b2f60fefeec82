"""ArtifactsRepository: runs, artifact pointers, events, snapshots, evidence and manifests.

One repository, the same contract on SQLite and Postgres. Appends to a run
(events, snapshots, the stop) lock the run's row (``FOR UPDATE`` on Postgres;
one writer lock on SQLite, whose deferred transactions cannot upgrade safely)
so sequence numbers have no gaps and the hash chain no forks.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session

from services.artifacts.domain.chain import event_hash
from services.artifacts.domain.entities import (
    Artifact,
    Event,
    Evidence,
    Manifest,
    Run,
    RunStatus,
    Snapshot,
)
from services.artifacts.domain.validation import canonical_json
from services.artifacts.tables import (
    ArtifactRow,
    EventRow,
    EvidenceRow,
    ManifestRow,
    RunRow,
    SnapshotRow,
    from_us,
    to_us,
)
from services.common.db import Database
from services.common.errors import AlreadyExists, FailedPrecondition, NotFound

_ARTIFACTS, _RUNS = ArtifactRow.__table__, RunRow.__table__
_ARTIFACT_BY_ID = select(*_ARTIFACTS.c, _RUNS.c.fleet_id).join_from(
    _ARTIFACTS, _RUNS, _ARTIFACTS.c.run_id == _RUNS.c.run_id).where(
    _ARTIFACTS.c.artifact_id == bindparam("artifact_id"))


@dataclass(frozen=True)
class EventDraft:
    type: str
    payload_json: str
    manifest_id: str = ""
    artifact_ids: tuple[str, ...] = ()
    agent_id: str = ""
    request_id: str = ""


class ArtifactsRepository:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._sqlite_lock = threading.Lock()

    def _write_lock(self) -> AbstractContextManager[object]:
        return self._sqlite_lock if self.db.dialect == "sqlite" else contextlib.nullcontext()

    # -- runs ---------------------------------------------------------------

    def _run_row(self, session: Session, fleet_id: str, run_id: str, *,
                 lock: bool = False) -> RunRow:
        query = select(RunRow).where(RunRow.run_id == run_id)
        if lock and self.db.dialect == "postgresql":
            query = query.with_for_update()
        row = session.scalars(query).first()
        if row is None or row.fleet_id != fleet_id:
            raise NotFound(f"run {run_id!r} not found in this fleet", reason="RUN_NOT_FOUND",
                           metadata={"run_id": run_id})
        return row

    def create_run(self, run: Run) -> tuple[Run, bool]:
        try:
            with self.db.session() as session:
                session.add(RunRow(
                    run_id=run.run_id, fleet_id=run.fleet_id, agent_id=run.agent_id,
                    status=run.status.value, stop_reason="", created_us=run.created_us,
                    stopped_us=0, event_count=0, head_hash="", latest_snapshot_id="",
                    metadata_json=run.metadata_json))
            return run, True
        except DbIntegrityError:
            existing = self.get_run(run.fleet_id, run.run_id)
            if existing.status is not RunStatus.RUNNING:
                raise AlreadyExists(
                    f"run {run.run_id!r} already exists and is {existing.status.value}; "
                    "start a new run with another id", reason="RUN_EXISTS") from None
            return existing, False

    def get_run(self, fleet_id: str, run_id: str) -> Run:
        with self.db.session() as session:
            return self._run_row(session, fleet_id, run_id).to_entity()

    def running_run(self, session: Session, fleet_id: str, run_id: str, *,
                    lock: bool = False) -> RunRow:
        row = self._run_row(session, fleet_id, run_id, lock=lock)
        if row.status != RunStatus.RUNNING.value:
            raise FailedPrecondition(
                f"run {run_id!r} is stopped ({row.status}); it takes no more writes",
                reason="RUN_STOPPED", metadata={"run_id": run_id, "status": row.status})
        return row

    def list_runs(self, fleet_id: str, after: list[object] | None, limit: int) -> list[Run]:
        query = select(RunRow).where(RunRow.fleet_id == fleet_id)
        if after is not None:
            created, run_id = int(str(after[0])), str(after[1])
            query = query.where(or_(RunRow.created_us < created,
                                    and_(RunRow.created_us == created, RunRow.run_id < run_id)))
        query = query.order_by(RunRow.created_us.desc(), RunRow.run_id.desc()).limit(limit)
        with self.db.session() as session:
            return [row.to_entity() for row in session.scalars(query)]

    def stop_run(self, fleet_id: str, run_id: str, status: RunStatus, reason: str,
                 event: EventDraft, now_us: int) -> Run:
        with self._write_lock(), self.db.session() as session:
            row = self.running_run(session, fleet_id, run_id, lock=True)
            self._append(session, row, event, now_us)
            row.status = status.value
            row.stop_reason = reason
            row.stopped_us = now_us
            session.flush()
            return row.to_entity()

    # -- events -------------------------------------------------------------

    def _append(self, session: Session, run: RunRow, draft: EventDraft, now_us: int) -> Event:
        seq = run.event_count + 1
        digest = event_hash(prev_hash=run.head_hash, run_id=run.run_id, seq=seq,
                            type=draft.type, payload_json=draft.payload_json,
                            manifest_id=draft.manifest_id, artifact_ids=draft.artifact_ids,
                            agent_id=draft.agent_id, created_us=now_us)
        row = EventRow(run_id=run.run_id, seq=seq, type=draft.type,
                       payload_json=draft.payload_json, manifest_id=draft.manifest_id,
                       artifact_ids_json=json.dumps(list(draft.artifact_ids)),
                       created_us=now_us, agent_id=draft.agent_id, prev_hash=run.head_hash,
                       hash=digest, request_id=draft.request_id or None)
        session.add(row)
        run.event_count = seq
        run.head_hash = digest
        return row.to_entity()

    def append_event(self, fleet_id: str, run_id: str, draft: EventDraft,
                     now_us: int) -> tuple[Event, bool]:
        with self._write_lock(), self.db.session() as session:
            if draft.request_id:
                prior = session.scalars(select(EventRow).where(
                    EventRow.run_id == run_id, EventRow.request_id == draft.request_id)).first()
                if prior is not None:
                    self._run_row(session, fleet_id, run_id)
                    return prior.to_entity(), False
            run = self.running_run(session, fleet_id, run_id, lock=True)
            self._check_references(session, fleet_id, run_id, draft.manifest_id,
                                   draft.artifact_ids)
            return self._append(session, run, draft, now_us), True

    def _check_references(self, session: Session, fleet_id: str, run_id: str,
                          manifest_id: str, artifact_ids: tuple[str, ...]) -> None:
        if manifest_id and session.get(ManifestRow, (fleet_id, manifest_id)) is None:
            raise NotFound(f"manifest {manifest_id!r} not found; create it before referencing it",
                           reason="MANIFEST_NOT_FOUND", metadata={"manifest_id": manifest_id})
        if artifact_ids:
            found = set(session.scalars(select(ArtifactRow.artifact_id).join(
                RunRow, RunRow.run_id == ArtifactRow.run_id).where(
                ArtifactRow.artifact_id.in_(artifact_ids), RunRow.fleet_id == fleet_id)))
            missing = [a for a in artifact_ids if a not in found]
            if missing:
                raise NotFound(f"artifacts not found in this fleet: {', '.join(missing[:5])}",
                               reason="ARTIFACT_NOT_FOUND",
                               metadata={"artifact_ids": ",".join(missing[:20])})

    def events_after(self, fleet_id: str, run_id: str, after_seq: int,
                     limit: int) -> list[Event]:
        with self.db.session() as session:
            self._run_row(session, fleet_id, run_id)
            return self._events_after(session, run_id, after_seq, limit)

    @staticmethod
    def _events_after(session: Session, run_id: str, after_seq: int, limit: int) -> list[Event]:
        rows = session.scalars(select(EventRow).where(
            EventRow.run_id == run_id, EventRow.seq > after_seq
        ).order_by(EventRow.seq).limit(limit))
        return [row.to_entity() for row in rows]

    def iter_events(self, fleet_id: str, run_id: str, batch: int = 1000) -> Iterator[Event]:
        """Every event from seq 1, fetched in batches (full replay)."""
        self.get_run(fleet_id, run_id)
        after = 0
        while True:
            with self.db.session() as session:
                events = self._events_after(session, run_id, after, batch)
            yield from events
            if len(events) < batch:
                return
            after = events[-1].seq

    # -- artifacts ----------------------------------------------------------

    def add_artifact(self, fleet_id: str, artifact: Artifact) -> Artifact:
        try:
            with self.db.session() as session:
                self.running_run(session, fleet_id, artifact.run_id)
                session.add(ArtifactRow(
                    artifact_id=artifact.artifact_id, run_id=artifact.run_id,
                    step_id=artifact.step_id, path=artifact.path, hash=artifact.hash,
                    mime_type=artifact.mime_type, size_bytes=artifact.size_bytes,
                    created_at=from_us(artifact.created_us),
                    metadata_=json.loads(artifact.metadata_json)))
        except DbIntegrityError:
            raise AlreadyExists(f"an artifact already exists at {artifact.path!r}",
                                reason="ARTIFACT_EXISTS",
                                metadata={"path": artifact.path}) from None
        return artifact

    def artifact_at(self, path: str) -> Artifact | None:
        with self.db.session() as session:
            row = session.scalars(select(ArtifactRow).where(ArtifactRow.path == path)).first()
            return None if row is None else row.to_entity()

    def get_artifact(self, fleet_id: str, artifact_id: str) -> Artifact:
        # The hottest read: one prebuilt Core statement, no ORM entity loading.
        with self.db.session() as session:
            row = session.connection().execute(_ARTIFACT_BY_ID,
                                               {"artifact_id": artifact_id}).first()
        if row is None or row.fleet_id != fleet_id:
            raise NotFound(f"artifact {artifact_id!r} not found in this fleet",
                           reason="ARTIFACT_NOT_FOUND", metadata={"artifact_id": artifact_id})
        return Artifact(artifact_id=row.artifact_id, run_id=row.run_id, step_id=row.step_id,
                        path=row.path, hash=row.hash, mime_type=row.mime_type,
                        size_bytes=row.size_bytes, created_us=to_us(row.created_at),
                        metadata_json=canonical_json(row.metadata))

    def list_artifacts(self, fleet_id: str, run_id: str, step_id: str,
                       after: list[object] | None, limit: int) -> list[Artifact]:
        query = select(ArtifactRow).where(ArtifactRow.run_id == run_id)
        if step_id:
            query = query.where(ArtifactRow.step_id == step_id)
        if after is not None:
            created, artifact_id = from_us(int(str(after[0]))), str(after[1])
            query = query.where(or_(
                ArtifactRow.created_at > created,
                and_(ArtifactRow.created_at == created, ArtifactRow.artifact_id > artifact_id)))
        query = query.order_by(ArtifactRow.created_at, ArtifactRow.artifact_id).limit(limit)
        with self.db.session() as session:
            self._run_row(session, fleet_id, run_id)
            return [row.to_entity() for row in session.scalars(query)]

    def iter_fleet_artifacts(self, fleet_id: str, run_id: str = "",
                             batch: int = 500) -> Iterator[Artifact]:
        after = ""
        while True:
            query = select(ArtifactRow).join(RunRow, RunRow.run_id == ArtifactRow.run_id).where(
                RunRow.fleet_id == fleet_id, ArtifactRow.artifact_id > after)
            if run_id:
                query = query.where(ArtifactRow.run_id == run_id)
            with self.db.session() as session:
                rows = [r.to_entity() for r in session.scalars(
                    query.order_by(ArtifactRow.artifact_id).limit(batch))]
            yield from rows
            if len(rows) < batch:
                return
            after = rows[-1].artifact_id

    # -- snapshots ----------------------------------------------------------

    def add_snapshot(self, fleet_id: str, snapshot: Snapshot) -> Snapshot:
        with self._write_lock(), self.db.session() as session:
            run = self.running_run(session, fleet_id, snapshot.run_id, lock=True)
            seq = snapshot.seq or run.event_count
            if seq > run.event_count or seq < 0:
                raise FailedPrecondition(
                    f"snapshot seq {seq} is past the run's last event ({run.event_count})",
                    reason="SNAPSHOT_AHEAD_OF_LOG")
            self._check_references(session, fleet_id, snapshot.run_id, snapshot.manifest_id,
                                   snapshot.artifact_ids)
            session.add(SnapshotRow(
                snapshot_id=snapshot.snapshot_id, run_id=snapshot.run_id, seq=seq,
                state_json=snapshot.state_json, state_hash=snapshot.state_hash,
                manifest_id=snapshot.manifest_id,
                artifact_ids_json=json.dumps(list(snapshot.artifact_ids)),
                created_us=snapshot.created_us))
            run.latest_snapshot_id = snapshot.snapshot_id
        return Snapshot(**{**snapshot.__dict__, "seq": seq})

    def latest_snapshot(self, fleet_id: str, run_id: str) -> tuple[Run, Snapshot | None]:
        with self.db.session() as session:
            run = self._run_row(session, fleet_id, run_id)
            if not run.latest_snapshot_id:
                return run.to_entity(), None
            row = session.get(SnapshotRow, run.latest_snapshot_id)
            return run.to_entity(), None if row is None else row.to_entity()

    def rehydrate(self, fleet_id: str, run_id: str,
                  limit: int) -> tuple[Run, Snapshot | None, list[Event]]:
        """Latest snapshot and the events after it: bounded reads, whatever the log's length."""
        with self.db.session() as session:
            run = self._run_row(session, fleet_id, run_id)
            snapshot = (session.get(SnapshotRow, run.latest_snapshot_id)
                        if run.latest_snapshot_id else None)
            after = snapshot.seq if snapshot is not None else 0
            events = self._events_after(session, run_id, after, limit)
            return (run.to_entity(), None if snapshot is None else snapshot.to_entity(), events)

    def list_snapshots(self, fleet_id: str, run_id: str, after: list[object] | None,
                       limit: int) -> list[Snapshot]:
        query = select(SnapshotRow).where(SnapshotRow.run_id == run_id)
        if after is not None:
            created, snapshot_id = int(str(after[0])), str(after[1])
            query = query.where(or_(
                SnapshotRow.created_us > created,
                and_(SnapshotRow.created_us == created, SnapshotRow.snapshot_id > snapshot_id)))
        query = query.order_by(SnapshotRow.created_us, SnapshotRow.snapshot_id).limit(limit)
        with self.db.session() as session:
            self._run_row(session, fleet_id, run_id)
            return [row.to_entity() for row in session.scalars(query)]

    # -- evidence and manifests ---------------------------------------------

    def add_evidence(self, evidence: Evidence) -> tuple[Evidence, bool]:
        with self._write_lock(), self.db.session() as session:
            prior = session.get(EvidenceRow, (evidence.fleet_id, evidence.evidence_id))
            if prior is not None:
                return prior.to_entity(), False
            if evidence.artifact_id:
                self._check_references(session, evidence.fleet_id, "", "",
                                       (evidence.artifact_id,))
            session.add(EvidenceRow(**evidence.__dict__))
        return evidence, True

    def get_evidence(self, fleet_id: str, evidence_id: str) -> Evidence | None:
        with self.db.session() as session:
            row = session.get(EvidenceRow, (fleet_id, evidence_id))
            return None if row is None else row.to_entity()

    def list_evidence(self, fleet_id: str, corpus_id: str, index_id: str,
                      after: list[object] | None, limit: int) -> list[Evidence]:
        query = select(EvidenceRow).where(EvidenceRow.fleet_id == fleet_id)
        if corpus_id:
            query = query.where(EvidenceRow.corpus_id == corpus_id)
        if index_id:
            query = query.where(EvidenceRow.index_id == index_id)
        if after is not None:
            query = query.where(EvidenceRow.evidence_id > str(after[0]))
        with self.db.session() as session:
            return [r.to_entity() for r in session.scalars(
                query.order_by(EvidenceRow.evidence_id).limit(limit))]

    def add_manifest(self, manifest: Manifest) -> tuple[Manifest, bool]:
        with self._write_lock(), self.db.session() as session:
            prior = session.get(ManifestRow, (manifest.fleet_id, manifest.manifest_id))
            if prior is not None:
                return prior.to_entity(), False
            if manifest.run_id:
                self._run_row(session, manifest.fleet_id, manifest.run_id)
            session.add(ManifestRow(**manifest.__dict__))
        return manifest, True

    def get_manifest(self, fleet_id: str, manifest_id: str) -> Manifest | None:
        with self.db.session() as session:
            row = session.get(ManifestRow, (fleet_id, manifest_id))
            return None if row is None else row.to_entity()

    def list_manifests(self, fleet_id: str, run_id: str, after: list[object] | None,
                       limit: int) -> list[Manifest]:
        query = select(ManifestRow).where(ManifestRow.fleet_id == fleet_id)
        if run_id:
            query = query.where(ManifestRow.run_id == run_id)
        if after is not None:
            query = query.where(ManifestRow.manifest_id > str(after[0]))
        with self.db.session() as session:
            return [r.to_entity() for r in session.scalars(
                query.order_by(ManifestRow.manifest_id).limit(limit))]
