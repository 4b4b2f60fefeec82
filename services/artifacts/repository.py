"""ArtifactsRepository: the SQL of runs, artifact pointers, events, snapshots, evidence and
manifests, the same on SQLite and Postgres.

Every method runs in the caller's session (:meth:`Database.session`), so one transaction
can span several calls; the service owns the transactions and the write lock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from sqlalchemy import Select, and_, bindparam, or_, select
from sqlalchemy.orm import QueryableAttribute, Session

from services.artifacts.domain.chain import (
    run_leaf,
    run_tombstone_intact,
    tombstone_intact,
)
from services.artifacts.domain.entities import (
    Artifact,
    Event,
    Evidence,
    Manifest,
    Run,
    RunStatus,
    Snapshot,
    SnapshotProblem,
    StoredTombstone,
)
from services.artifacts.tables import (
    ArtifactRow,
    EventRow,
    EvidenceRow,
    FleetSecretRow,
    ManifestKeyRow,
    ManifestRow,
    RunRow,
    RunTombstoneRow,
    SnapshotRow,
    from_us,
    to_us,
)
from services.common.canonical import canonical_json
from services.common.errors import NotFound
from services.common.fleet_secrets import fleet_secret

R = TypeVar("R", bound=tuple[Any, ...])
E = TypeVar("E", covariant=True)

_ARTIFACTS = ArtifactRow.__table__
_ARTIFACT_BY_ID = select(_ARTIFACTS).where(_ARTIFACTS.c.artifact_id == bindparam("artifact_id"))


class _Row(Protocol[E]):
    def to_entity(self) -> E: ...


def _entity(row: _Row[E] | None) -> E | None:
    """The row as its domain object; ``None`` for no row."""
    return None if row is None else row.to_entity()


def _oldest_first(query: Select[R], created: QueryableAttribute[Any],
                  key: QueryableAttribute[str], after: list[object] | None, limit: int,
                  moment: Callable[[int], object] = int) -> Select[R]:
    """A page in (creation, id) order, from just past the page key ``after``."""
    if after is not None:
        start, last = moment(int(str(after[0]))), str(after[1])
        query = query.where(or_(created > start, and_(created == start, key > last)))
    return query.order_by(created, key).limit(limit)


def _in_id_order(query: Select[R], key: QueryableAttribute[str], after: list[object] | None,
                 limit: int) -> Select[R]:
    """A page in id order, from just past the page key ``after``."""
    if after is not None:
        query = query.where(key > str(after[0]))
    return query.order_by(key).limit(limit)


class ArtifactsRepository:
    def __init__(self, dialect: str) -> None:
        self.dialect = dialect

    # -- runs ---------------------------------------------------------------

    def get_run(self, session: Session, fleet_id: str, run_id: str, *,
                lock: bool = False) -> Run:
        """The run; ``lock`` holds its row until the transaction ends (appends to the run)."""
        query = select(RunRow).where(RunRow.fleet_id == fleet_id, RunRow.run_id == run_id)
        if lock and self.dialect == "postgresql":
            query = query.with_for_update()
        row = session.scalars(query).first()
        if row is None:
            erased = self.run_tombstone(session, fleet_id, run_id)
            if erased is not None:
                raise NotFound(f"run {run_id!r} was erased (erasure {erased})",
                               reason="RUN_ERASED",
                               metadata={"run_id": run_id, "erasure_id": erased})
            raise NotFound(f"run {run_id!r} not found in this fleet", reason="RUN_NOT_FOUND",
                           metadata={"run_id": run_id})
        return row.to_entity()

    def run_tombstone(self, session: Session, fleet_id: str, run_id: str) -> str | None:
        """The erasure that erased this run, or None."""
        row = session.get(RunTombstoneRow, (fleet_id, run_id))
        return row.erasure_id if row is not None else None

    def run_tombstones(self, session: Session, fleet_id: str, after: str,
                       limit: int) -> list[StoredTombstone]:
        """The fleet's erased runs, in run id order past ``after``: each leaf is the head hash
        the erasure listed (``run_leaf``), its form an erasure id of governance's and a time."""
        query = select(RunTombstoneRow).where(RunTombstoneRow.fleet_id == fleet_id,
                                              RunTombstoneRow.run_id > after)
        return [StoredTombstone("run", row.run_id, row.run_id, run_leaf(row.head_hash),
                                row.erasure_id, run_tombstone_intact(
                                    row.head_hash, row.erasure_id, row.erased_us))
                for row in session.scalars(query.order_by(RunTombstoneRow.run_id).limit(limit))]

    def add_run(self, session: Session, run: Run) -> None:
        session.add(RunRow(
            run_id=run.run_id, fleet_id=run.fleet_id, agent_id=run.agent_id,
            status=run.status.value, stop_reason=run.stop_reason, created_us=run.created_us,
            stopped_us=run.stopped_us, event_count=0, head_hash="", latest_snapshot_id="",
            metadata_json=run.metadata_json))

    def list_runs(self, session: Session, fleet_id: str, after: list[object] | None,
                  limit: int) -> list[Run]:
        query = select(RunRow).where(RunRow.fleet_id == fleet_id)
        if after is not None:
            created, run_id = int(str(after[0])), str(after[1])
            query = query.where(or_(RunRow.created_us < created,
                                    and_(RunRow.created_us == created, RunRow.run_id < run_id)))
        query = query.order_by(RunRow.created_us.desc(), RunRow.run_id.desc()).limit(limit)
        return [row.to_entity() for row in session.scalars(query)]

    def mark_stopped(self, session: Session, fleet_id: str, run_id: str, status: RunStatus,
                     reason: str, stopped_us: int) -> Run:
        row = session.get_one(RunRow, (fleet_id, run_id))
        row.status = status.value
        row.stop_reason = reason
        row.stopped_us = stopped_us
        session.flush()
        return row.to_entity()

    # -- events -------------------------------------------------------------

    def add_event(self, session: Session, fleet_id: str, event: Event, request_id: str) -> None:
        """Store ``event`` and make it its run's head."""
        session.add(EventRow(
            fleet_id=fleet_id, run_id=event.run_id, seq=event.seq, type=event.type,
            payload_json=event.payload_json, manifest_id=event.manifest_id,
            artifact_ids_json=json.dumps(list(event.artifact_ids)), created_us=event.created_us,
            agent_id=event.agent_id, prev_hash=event.prev_hash, hash=event.hash,
            request_id=request_id or None, format=event.format, salt=event.salt,
            payload_commitment=event.payload_commitment, erasure_id=event.erasure_id,
            erased_us=event.erased_us, erased_by=event.erased_by))
        run = session.get_one(RunRow, (fleet_id, event.run_id))
        run.event_count = event.seq
        run.head_hash = event.hash

    def event_for_request(self, session: Session, fleet_id: str, run_id: str,
                          request_id: str) -> Event | None:
        return _entity(session.scalars(select(EventRow).where(
            EventRow.fleet_id == fleet_id, EventRow.run_id == run_id,
            EventRow.request_id == request_id)).first())

    def events_after(self, session: Session, fleet_id: str, run_id: str, after_seq: int,
                     limit: int) -> list[Event]:
        rows = session.scalars(select(EventRow).where(
            EventRow.fleet_id == fleet_id, EventRow.run_id == run_id, EventRow.seq > after_seq
        ).order_by(EventRow.seq).limit(limit))
        return [row.to_entity() for row in rows]

    def event_tombstones(self, session: Session, fleet_id: str, run_id: str,
                         after: tuple[str, int], limit: int) -> list[StoredTombstone]:
        """The fleet's events erased in place (one run's when ``run_id`` is set), in (run,
        seq) order past ``after``."""
        query = select(EventRow).where(
            EventRow.fleet_id == fleet_id, EventRow.erasure_id != "",
            or_(EventRow.run_id > after[0],
                and_(EventRow.run_id == after[0], EventRow.seq > after[1])))
        if run_id:
            query = query.where(EventRow.run_id == run_id)
        return [StoredTombstone("event", f"{row.run_id}:{row.seq}", row.run_id, row.hash,
                                row.erasure_id, tombstone_intact(
                                    row.format, row.salt, row.payload_json,
                                    row.payload_commitment, erasure_id=row.erasure_id,
                                    erased_us=row.erased_us))
                for row in session.scalars(
                    query.order_by(EventRow.run_id, EventRow.seq).limit(limit))]

    # -- artifacts ----------------------------------------------------------

    def add_artifact(self, session: Session, fleet_id: str, artifact: Artifact,
                     name: str) -> None:
        session.add(ArtifactRow(
            artifact_id=artifact.artifact_id, fleet_id=fleet_id, run_id=artifact.run_id,
            step_id=artifact.step_id, name=name, path=artifact.path, hash=artifact.hash,
            mime_type=artifact.mime_type, size_bytes=artifact.size_bytes,
            created_at=from_us(artifact.created_us),
            metadata_=json.loads(artifact.metadata_json)))

    def artifact_named(self, session: Session, fleet_id: str, run_id: str, step_id: str,
                       name: str) -> Artifact | None:
        return _entity(session.scalars(select(ArtifactRow).where(
            ArtifactRow.fleet_id == fleet_id, ArtifactRow.run_id == run_id,
            ArtifactRow.step_id == step_id, ArtifactRow.name == name)).first())

    def get_artifact(self, session: Session, fleet_id: str, artifact_id: str) -> Artifact:
        # The hottest read: one prebuilt Core statement, no ORM entity loading.
        row = session.connection().execute(_ARTIFACT_BY_ID,
                                           {"artifact_id": artifact_id}).first()
        if row is None or row.fleet_id != fleet_id:
            raise NotFound(f"artifact {artifact_id!r} not found in this fleet",
                           reason="ARTIFACT_NOT_FOUND", metadata={"artifact_id": artifact_id})
        return Artifact(artifact_id=row.artifact_id, run_id=row.run_id, step_id=row.step_id,
                        path=row.path, hash=row.hash, mime_type=row.mime_type,
                        size_bytes=row.size_bytes, created_us=to_us(row.created_at),
                        metadata_json=canonical_json(row.metadata))

    def artifact_ids_in_fleet(self, session: Session, fleet_id: str,
                              artifact_ids: tuple[str, ...]) -> set[str]:
        """Which of ``artifact_ids`` name artifacts of this fleet."""
        return set(session.scalars(select(ArtifactRow.artifact_id).where(
            ArtifactRow.artifact_id.in_(artifact_ids), ArtifactRow.fleet_id == fleet_id)))

    def list_artifacts(self, session: Session, fleet_id: str, run_id: str, step_id: str,
                       after: list[object] | None, limit: int) -> list[Artifact]:
        query = select(ArtifactRow).where(ArtifactRow.fleet_id == fleet_id,
                                          ArtifactRow.run_id == run_id)
        if step_id:
            query = query.where(ArtifactRow.step_id == step_id)
        query = _oldest_first(query, ArtifactRow.created_at, ArtifactRow.artifact_id, after,
                              limit, from_us)
        return [row.to_entity() for row in session.scalars(query)]

    def fleet_artifacts(self, session: Session, fleet_id: str, run_id: str, after: str,
                        limit: int) -> list[Artifact]:
        """The fleet's artifacts (one run's when ``run_id`` is set) in id order past ``after``."""
        query = select(ArtifactRow).where(ArtifactRow.fleet_id == fleet_id,
                                          ArtifactRow.artifact_id > after)
        if run_id:
            query = query.where(ArtifactRow.run_id == run_id)
        return [row.to_entity() for row in session.scalars(
            query.order_by(ArtifactRow.artifact_id).limit(limit))]

    # -- snapshots ----------------------------------------------------------

    def snapshot_problems(self, session: Session, fleet_id: str, run_id: str, after: str,
                          limit: int) -> list[tuple[str, SnapshotProblem | None, bool]]:
        """The fleet's snapshots (one run's when ``run_id`` is set) in id order past ``after``,
        each re-hashed: (snapshot id, its problem or None, whether it was erased in place)."""
        query = select(SnapshotRow).where(SnapshotRow.fleet_id == fleet_id,
                                          SnapshotRow.snapshot_id > after)
        if run_id:
            query = query.where(SnapshotRow.run_id == run_id)
        return [(row.snapshot_id, row.problem(), bool(row.erasure_id)) for row in session.scalars(
            query.order_by(SnapshotRow.snapshot_id).limit(limit))]

    def snapshot_tombstones(self, session: Session, fleet_id: str, run_id: str, after: str,
                            limit: int) -> list[StoredTombstone]:
        """The fleet's snapshots erased in place (one run's when ``run_id`` is set), in id
        order past ``after``."""
        query = select(SnapshotRow).where(SnapshotRow.fleet_id == fleet_id,
                                          SnapshotRow.erasure_id != "",
                                          SnapshotRow.snapshot_id > after)
        if run_id:
            query = query.where(SnapshotRow.run_id == run_id)
        return [StoredTombstone("snapshot", row.snapshot_id, row.run_id, row.state_hash,
                                row.erasure_id, row.problem() is None)
                for row in session.scalars(query.order_by(SnapshotRow.snapshot_id).limit(limit))]

    def add_snapshot(self, session: Session, fleet_id: str, snapshot: Snapshot,
                     request_id: str) -> None:
        """Store ``snapshot`` and make it its run's latest."""
        session.add(SnapshotRow(
            snapshot_id=snapshot.snapshot_id, fleet_id=fleet_id, run_id=snapshot.run_id,
            seq=snapshot.seq, request_id=request_id or None,
            state_json=snapshot.state_json, state_hash=snapshot.state_hash,
            manifest_id=snapshot.manifest_id,
            artifact_ids_json=json.dumps(list(snapshot.artifact_ids)),
            created_us=snapshot.created_us, format=snapshot.format, salt=snapshot.salt,
            erasure_id=snapshot.erasure_id, erased_us=snapshot.erased_us,
            erased_by=snapshot.erased_by))
        run = session.get_one(RunRow, (fleet_id, snapshot.run_id))
        run.latest_snapshot_id = snapshot.snapshot_id

    def artifact_id_taken(self, session: Session, artifact_id: str) -> bool:
        """Whether any fleet's artifact has this id (ids are keys across fleets)."""
        return session.get(ArtifactRow, artifact_id) is not None

    def artifact_key(self, session: Session, artifact_id: str) -> str | None:
        """The blob key of the artifact with this id (any fleet's), or None."""
        return session.scalar(select(ArtifactRow.path).where(
            ArtifactRow.artifact_id == artifact_id))

    def snapshot_id_taken(self, session: Session, snapshot_id: str) -> bool:
        """Whether any fleet's snapshot has this id (ids are keys across fleets)."""
        return session.get(SnapshotRow, snapshot_id) is not None

    def set_latest_snapshot(self, session: Session, fleet_id: str, run_id: str,
                            snapshot_id: str) -> None:
        session.get_one(RunRow, (fleet_id, run_id)).latest_snapshot_id = snapshot_id

    def snapshot_for_request(self, session: Session, fleet_id: str, run_id: str,
                             request_id: str) -> Snapshot | None:
        return _entity(session.scalars(select(SnapshotRow).where(
            SnapshotRow.fleet_id == fleet_id, SnapshotRow.run_id == run_id,
            SnapshotRow.request_id == request_id)).first())

    def get_snapshot(self, session: Session, fleet_id: str, snapshot_id: str) -> Snapshot | None:
        row = session.get(SnapshotRow, snapshot_id)
        return None if row is None or row.fleet_id != fleet_id else row.to_entity()

    def list_snapshots(self, session: Session, fleet_id: str, run_id: str,
                       after: list[object] | None, limit: int) -> list[Snapshot]:
        query = _oldest_first(select(SnapshotRow).where(SnapshotRow.fleet_id == fleet_id,
                                                        SnapshotRow.run_id == run_id),
                              SnapshotRow.created_us, SnapshotRow.snapshot_id, after, limit)
        return [row.to_entity() for row in session.scalars(query)]

    # -- evidence and manifests ---------------------------------------------

    def add_evidence(self, session: Session, evidence: Evidence) -> None:
        session.add(EvidenceRow(**evidence.__dict__))

    def get_evidence(self, session: Session, fleet_id: str, evidence_id: str) -> Evidence | None:
        return _entity(session.get(EvidenceRow, (fleet_id, evidence_id)))

    def list_evidence(self, session: Session, fleet_id: str, corpus_id: str, index_id: str,
                      after: list[object] | None, limit: int) -> list[Evidence]:
        query = select(EvidenceRow).where(EvidenceRow.fleet_id == fleet_id)
        if corpus_id:
            query = query.where(EvidenceRow.corpus_id == corpus_id)
        if index_id:
            query = query.where(EvidenceRow.index_id == index_id)
        query = _in_id_order(query, EvidenceRow.evidence_id, after, limit)
        return [row.to_entity() for row in session.scalars(query)]

    def add_manifest(self, session: Session, manifest: Manifest) -> None:
        session.add(ManifestRow(**manifest.__dict__))

    def fleet_secret(self, session: Session, fleet_id: str) -> bytes:
        return fleet_secret(session, FleetSecretRow, fleet_id)

    def manifest_by_key(self, session: Session, fleet_id: str, key: str) -> Manifest | None:
        """The format-2 manifest a manifest key landed on (None: none stored)."""
        row = session.scalars(select(ManifestRow).join(ManifestKeyRow, and_(
            ManifestKeyRow.fleet_id == ManifestRow.fleet_id,
            ManifestKeyRow.manifest_id == ManifestRow.manifest_id)).where(
            ManifestKeyRow.fleet_id == fleet_id, ManifestKeyRow.key == key)).first()
        return row.to_entity() if row is not None else None

    def add_manifest_key(self, session: Session, fleet_id: str, key: str,
                         manifest_id: str) -> None:
        session.add(ManifestKeyRow(fleet_id=fleet_id, key=key, manifest_id=manifest_id))

    def get_manifest(self, session: Session, fleet_id: str, manifest_id: str) -> Manifest | None:
        return _entity(session.get(ManifestRow, (fleet_id, manifest_id)))

    def list_manifests(self, session: Session, fleet_id: str, run_id: str,
                       after: list[object] | None, limit: int) -> list[Manifest]:
        query = select(ManifestRow).where(ManifestRow.fleet_id == fleet_id)
        if run_id:
            query = query.where(ManifestRow.run_id == run_id)
        query = _in_id_order(query, ManifestRow.manifest_id, after, limit)
        return [row.to_entity() for row in session.scalars(query)]
