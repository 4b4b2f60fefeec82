"""RunEraser: the artifacts service's part of ``engram forget`` (docs/erasure.md).

It reads the erasure from governance (which chained it first). The single events and
snapshots it lists are tombstoned in place, their runs kept (``item_erasure``), in one
transaction before any run; for each run it lists, in one transaction: deletes the run's
events, snapshots, manifests, artifact rows and the evidence citing those artifacts, and
replaces the run by a tombstone (author, event count,
head hash, the erasure). The blobs go after the commit, every S3 version of them; a blob
that could not be purged stays listed in the tombstone and a rerun of the erasure finishes
it. Then the freed space is purged (SQLite: WAL truncated, pages zeroed by secure_delete;
Postgres: VACUUM). The run id is never used again: StartRun refuses it. Manifests built for
no run and evidence citing no artifact (``manifest`` and ``evidence`` items) are deleted
outright, in one transaction before the runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.orm import InstrumentedAttribute, Session

from services.artifacts.domain.chain import run_leaf
from services.artifacts.item_erasure import (
    IN_PLACE_KINDS,
    ErasedInPlace,
    erase_in_place,
    leaf_mismatch,
)
from services.artifacts.service import ArtifactsService
from services.artifacts.tables import (
    ArtifactRow,
    EventRow,
    EvidenceRow,
    ManifestKeyRow,
    ManifestRow,
    RunRow,
    RunTombstoneRow,
    SnapshotRow,
)
from services.common.erasure_source import (
    MAX_ERASURE_ITEMS,
    ErasureOrder,
    ErasureSource,
    PurgeThrottle,
    TextScans,
    recorded_erasure,
    selection_limit,
    while_wanted,
)
from services.common.errors import FailedPrecondition
from services.common.find_cursor import FindCursor, ItemOrder, runs_from
from services.common.text_match import bytes_hold, holds, json_holds, needle_of

log = logging.getLogger("engram.artifacts.erasure")

PURGED_TABLES = ("runs", "events", "snapshots", "artifacts", "manifests", "manifest_keys",
                 "evidence")
LOOSE_KINDS = ("manifest", "evidence")
EVIDENCE_LEAF = "0" * 64
"""The leaf an ``evidence`` item lists: evidence has no hash of its own (its id derives from
where it points, not from what it says)."""
LOOSE_PHASE = -1
"""A find cursor's ``created_us`` once every run was scanned: the items of no run follow
(no run is created before 0)."""


MAX_PLACES = 5


@dataclass(frozen=True)
class FoundRun:
    run_id: str
    head_hash: str
    places: list[str]
    items: list[tuple[str, str, str]] = field(default_factory=list)
    """(kind, id, leaf hash) of the format-2 events and snapshots holding the text in their
    payload or state: erasable in place."""
    whole_run_needed: bool = False
    """The text is also where only erasing the whole run removes it."""


@dataclass(frozen=True)
class LooseItem:
    kind: str  # manifest or evidence
    id: str
    leaf_hash: str
    format: int
    """A manifest's: 1 when its id derives from its content (stored before format 2)."""


@dataclass(frozen=True)
class FoundPage:
    runs: list[FoundRun]
    loose: list[LooseItem]
    """(kind, id, leaf hash) of the manifests of no run and the evidence citing no artifact
    holding the text: erased outright."""
    following: FindCursor | None
    """Where the next page starts (None: no more)."""


@dataclass(frozen=True)
class ErasedLoose:
    manifests: int = 0
    evidence: int = 0
    already: int = 0


@dataclass(frozen=True)
class ForgottenRun:
    run_id: str
    head_hash: str
    events: int
    snapshots: int
    artifacts: int
    manifests: int
    evidence: int


class RunEraser:
    def __init__(self, service: ArtifactsService, source: ErasureSource | None) -> None:
        self.service = service
        self.source = source
        self._purge_throttle = PurgeThrottle()
        self._scans = TextScans()

    def erase(self, fleet_id: str, erasure_id: str,
              now_us: int) -> tuple[list[ForgottenRun], int, ErasedInPlace, ErasedLoose]:
        order = recorded_erasure(self.source, "artifacts", erasure_id, fleet_id)
        leaves = {item_id: leaf for kind, item_id, leaf in order.items if kind == "run"}
        # A run whose head is not the one listed refuses the erasure before anything of it is
        # changed (checked again under the run's lock when it is erased).
        with self.service.db.session() as session:
            for run_id, leaf in leaves.items():
                _check_run_leaf(session, order, run_id, leaf)
        in_place, loose = ErasedInPlace(), ErasedLoose()
        if any(kind in (*IN_PLACE_KINDS, *LOOSE_KINDS) for kind, _, _ in order.items):
            # One transaction: every item checked before any is changed.
            with self.service.writing() as session:  # appends to the runs wait
                in_place = erase_in_place(session, order, now_us)
                loose = _erase_loose(session, order)
            if in_place.events or in_place.snapshots or loose.manifests or loose.evidence:
                self._purge_throttle.owe()
        erased: list[ForgottenRun] = []
        already = 0
        for run_id in leaves:
            with self.service.writing() as session:  # appends and uploads to the run wait
                done = session.get(RunTombstoneRow, (fleet_id, run_id))
                if done is not None:
                    already += 1
                    continue
                forgotten = self._erase_run(session, order, run_id, leaves[run_id], now_us)
            if forgotten is not None:
                self._purge_throttle.owe()
                erased.append(forgotten)
        self._purge_blobs(fleet_id, list(leaves))
        changed = bool(erased) or bool(in_place.events or in_place.snapshots
                                       or loose.manifests or loose.evidence)
        self._purge_throttle.purge(lambda: self.service.db.vacuum(PURGED_TABLES))
        if changed:
            log.info("runs erased", extra={"erasure_id": erasure_id, "fleet_id": fleet_id,
                                           "runs": len(erased), "already": already,
                                           "events": in_place.events,
                                           "snapshots": in_place.snapshots,
                                           "manifests": loose.manifests,
                                           "evidence": loose.evidence})
        return erased, already, in_place, loose

    def find(self, fleet_id: str, match: str, limit: int,
             active: Callable[[], bool] = lambda: True,
             start: FindCursor | None = None) -> FoundPage:
        """The fleet's runs holding ``match`` anywhere (oldest first, from ``start``): the
        run's metadata and stop reason, its events, snapshots, manifests, artifacts and the
        evidence citing them, reading every blob; after the last run, the manifests of no
        run and the evidence citing no artifact holding it. Stops when ``active`` says the
        caller has gone."""
        needle = needle_of(match)
        limit = selection_limit(limit)
        with self._scans.slot("FindRuns"):
            if start is not None and start.created_us == LOOSE_PHASE:
                loose, following = self._find_loose(fleet_id, needle, MAX_ERASURE_ITEMS,
                                                    active, start.after_item)
                return FoundPage([], loose, following)
            runs, following, items_found = self._find(fleet_id, needle, limit, active, start)
            if following is not None:
                return FoundPage(runs, [], following)
            loose, following = self._find_loose(fleet_id, needle,
                                                MAX_ERASURE_ITEMS - items_found, active, None)
            return FoundPage(runs, loose, following)

    def _find_loose(self, fleet_id: str, needle: str, room: int, active: Callable[[], bool],
                    after: ItemOrder | None) -> tuple[list[LooseItem], FindCursor | None]:
        """The manifests of no run (by content) and the evidence citing no artifact (by chunk
        id or metadata) holding the text, in (kind, created, id) order past ``after``: at
        most ``room`` of them, and where the next page goes on."""
        found: list[LooseItem] = []
        last: ItemOrder | None = after
        for item, order in self._loose_items(fleet_id, needle, active, after):
            if len(found) >= room:
                return found, FindCursor(LOOSE_PHASE, "", last)
            found.append(item)
            last = order
        return found, None

    def _loose_items(self, fleet_id: str, needle: str, active: Callable[[], bool],
                     after: ItemOrder | None) -> Iterator[tuple[LooseItem, ItemOrder]]:
        after = after or (0, -1, "")
        with self.service.db.session() as session:
            for number, (kind, table, key, of_no_run, leaf, format_, texts) in enumerate(
                    _LOOSE):
                if number < after[0]:
                    continue
                rows = session.execute(select(key, leaf, format_, table.created_us, *texts)
                                       .where(table.fleet_id == fleet_id, of_no_run,
                                              _past(table.created_us, key, after, number))
                                       .order_by(table.created_us, key)
                                       .execution_options(yield_per=200))
                for item_id, leaf_hash, stored_format, created_us, *values in while_wanted(
                        rows, active):
                    if any(json_holds(value, needle) for value in values):
                        yield (LooseItem(kind, item_id, leaf_hash, stored_format),
                               (number, created_us, item_id))

    def _find(self, fleet_id: str, needle: str, limit: int, active: Callable[[], bool],
              start: FindCursor | None) -> tuple[list[FoundRun], FindCursor | None, int]:
        """The runs holding the text, where the next page starts (None: every run was
        scanned) and how many items the runs listed hold."""
        with self.service.db.session() as session:
            runs = session.execute(select(
                RunRow.run_id, RunRow.head_hash, RunRow.metadata_json, RunRow.stop_reason,
                RunRow.created_us).where(
                RunRow.fleet_id == fleet_id,
                runs_from(RunRow.created_us, RunRow.run_id, start)).order_by(
                RunRow.created_us, RunRow.run_id)).all()
        found: list[FoundRun] = []
        items_found = 0
        for run_id, head_hash, metadata_json, stop_reason, created_us in while_wanted(
                runs, active):
            # The run's own record first: StartRun's metadata and StopRun's reason, which
            # GetRun and ListRuns hand every agent of the fleet.
            places = [place for place, held in (
                ("run metadata", json_holds(metadata_json or "", needle)),
                ("run stop_reason", holds(stop_reason or "", needle))) if held]
            whole = bool(places)
            resumed = start.listed_in(run_id) if start is not None else None
            items = [item for item in self._items(fleet_id, run_id, needle)
                     if resumed is None or item[3] > resumed]
            places += [f"{kind} {item_id.rpartition(':')[2] if kind == 'event' else item_id}"
                       for kind, item_id, _, _ in items]
            others = self._places(fleet_id, run_id, needle)
            places += others
            if places:
                if len(found) == limit or (found and items_found + len(items) >
                                           MAX_ERASURE_ITEMS):
                    return found, FindCursor(created_us, run_id, resumed), items_found
                listed = items[:MAX_ERASURE_ITEMS]  # one run alone: the rest the next time
                found.append(FoundRun(run_id, head_hash, places[:MAX_PLACES],
                                      [(kind, item_id, leaf) for kind, item_id, leaf, _ in listed],
                                      whole or bool(others)))
                if len(items) > MAX_ERASURE_ITEMS:
                    return found, FindCursor(created_us, run_id, listed[-1][3]), len(listed)
                items_found += len(items)
        return found, None, items_found

    def _items(self, fleet_id: str, run_id: str,
               needle: str) -> list[tuple[str, str, str, ItemOrder]]:
        """The run's format-2 events and snapshots, not erased yet, whose payload or state
        holds the text: (kind, id, leaf hash, place in the scan), erasable in place."""
        items: list[tuple[str, str, str, ItemOrder]] = []
        with self.service.db.session() as session:
            events = session.execute(select(EventRow.seq, EventRow.payload_json,
                                            EventRow.hash).where(
                EventRow.fleet_id == fleet_id, EventRow.run_id == run_id,
                EventRow.format == 2).order_by(EventRow.seq))
            items += [("event", f"{run_id}:{seq}", leaf, (0, seq, ""))
                      for seq, payload, leaf in events if json_holds(payload, needle)]
            snapshots = session.execute(select(SnapshotRow.snapshot_id, SnapshotRow.state_json,
                                               SnapshotRow.state_hash,
                                               SnapshotRow.created_us).where(
                SnapshotRow.fleet_id == fleet_id, SnapshotRow.run_id == run_id,
                SnapshotRow.format == 2).order_by(SnapshotRow.created_us,
                                                  SnapshotRow.snapshot_id))
            items += [("snapshot", snapshot_id, leaf, (1, created_us, snapshot_id))
                      for snapshot_id, state, leaf, created_us in snapshots
                      if json_holds(state, needle)]
        return items

    def _places(self, fleet_id: str, run_id: str, needle: str) -> list[str]:
        """Where the text is that only erasing the whole run removes: an event's type, a
        format-1 event's payload or snapshot's state, a manifest, cited evidence, an
        artifact's name, metadata or bytes."""
        places: list[str] = []
        with self.service.db.session() as session:
            for table, key, texts, legacy in (
                    (EventRow, EventRow.seq, (EventRow.payload_json, EventRow.type),
                     EventRow.format),
                    (SnapshotRow, SnapshotRow.snapshot_id, (SnapshotRow.state_json,),
                     SnapshotRow.format),
                    (ManifestRow, ManifestRow.manifest_id, (ManifestRow.content_json,),
                     None)):
                columns = texts if legacy is None else (*texts, legacy)
                rows = session.execute(select(key, *columns).where(
                    table.fleet_id == fleet_id, table.run_id == run_id))
                for name, *values in rows:
                    if legacy is not None and values.pop() == 2:
                        values = values[1:]  # its payload or state is erasable in place
                    if any(json_holds(str(v), needle) for v in values):
                        places.append(f"{table.__tablename__.rstrip('s')} {name}")
            artifacts = session.execute(select(
                ArtifactRow.artifact_id, ArtifactRow.name, ArtifactRow.path,
                ArtifactRow.metadata_).where(ArtifactRow.fleet_id == fleet_id,
                                             ArtifactRow.run_id == run_id)).all()
            ids = [a.artifact_id for a in artifacts]
            cited = session.execute(select(EvidenceRow.evidence_id, EvidenceRow.metadata_json,
                                           EvidenceRow.chunk_id).where(
                EvidenceRow.fleet_id == fleet_id, EvidenceRow.artifact_id.in_(ids))).all()
        for evidence_id, metadata_json, chunk_id in cited:
            if json_holds(metadata_json, needle) or holds(chunk_id, needle):
                places.append(f"evidence {evidence_id}")
        for artifact in artifacts:
            named = holds(artifact.name, needle) or json_holds(
                json.dumps(artifact.metadata_ or {}), needle)
            if named or bytes_hold(self.service.blobs.open(artifact.path), needle):
                places.append(f"artifact {artifact.artifact_id}")
        return places[:MAX_PLACES]

    def _erase_run(self, session: Session, order: ErasureOrder, run_id: str, leaf: str,
                   now_us: int) -> ForgottenRun | None:
        fleet_id = order.fleet_id
        run = session.scalars(select(RunRow).where(RunRow.fleet_id == fleet_id,
                                                   RunRow.run_id == run_id)
                              .with_for_update()).first()
        if run is None:
            # Never started here, or erased by a call that ran at once with this one. An
            # imported erasure (a bundle's) keeps the id erased all the same, so a bundle made
            # before the erasure cannot bring the run back; one recorded here does not (a
            # governor could otherwise take any future run id away).
            if order.imported and self.service.db.insert_once(session, RunTombstoneRow, dict(
                    fleet_id=fleet_id, run_id=run_id, agent_id="", created_us=0, event_count=0,
                    head_hash=leaf, erasure_id=order.erasure_id, erased_us=now_us,
                    erased_by=order.requested_by, blobs_left_json="[]")):
                return ForgottenRun(run_id, leaf, 0, 0, 0, 0, 0)
            return None
        _check_leaf(order, run_id, run.head_hash, leaf)
        of_run = (ArtifactRow.fleet_id == fleet_id, ArtifactRow.run_id == run_id)
        artifacts = session.execute(select(ArtifactRow.artifact_id, ArtifactRow.path)
                                    .where(*of_run)).all()
        artifact_ids = [a.artifact_id for a in artifacts]
        counts = {
            "events": _count(session, EventRow, fleet_id, run_id),
            "snapshots": _count(session, SnapshotRow, fleet_id, run_id),
            "manifests": _count(session, ManifestRow, fleet_id, run_id),
        }
        evidence = 0
        for start in range(0, len(artifact_ids), 500):
            citing = (EvidenceRow.fleet_id == fleet_id,
                      EvidenceRow.artifact_id.in_(artifact_ids[start:start + 500]))
            evidence += int(session.scalar(select(func.count()).select_from(EvidenceRow)
                                           .where(*citing)) or 0)
            session.execute(delete(EvidenceRow).where(*citing))
        session.execute(delete(ManifestKeyRow).where(
            ManifestKeyRow.fleet_id == fleet_id, ManifestKeyRow.manifest_id.in_(
                select(ManifestRow.manifest_id).where(ManifestRow.fleet_id == fleet_id,
                                                      ManifestRow.run_id == run_id))))
        for table in (EventRow, SnapshotRow, ManifestRow, ArtifactRow):
            session.execute(delete(table).where(table.fleet_id == fleet_id,
                                                table.run_id == run_id))
        session.execute(insert(RunTombstoneRow).values(
            fleet_id=fleet_id, run_id=run_id, agent_id=run.agent_id, created_us=run.created_us,
            event_count=run.event_count, head_hash=run.head_hash, erasure_id=order.erasure_id,
            erased_us=now_us, erased_by=order.requested_by,
            blobs_left_json=json.dumps([a.path for a in artifacts])))
        session.delete(run)
        return ForgottenRun(run_id, leaf, counts["events"], counts["snapshots"], len(artifacts),
                            counts["manifests"], evidence)

    def _purge_blobs(self, fleet_id: str, run_ids: list[str]) -> None:
        for run_id in run_ids:
            with self.service.db.session() as session:
                row = session.get(RunTombstoneRow, (fleet_id, run_id))
                left = json.loads(row.blobs_left_json) if row is not None else []
            # And whatever else lies under the run's own key prefix: a blob an upload or an
            # import stored before failing to insert its row (no row lists it).
            stray = [key for key in self.service.blobs.list(f"fleets/{fleet_id}/runs/{run_id}/")
                     if key not in left]
            if not left and not stray:
                continue
            for path in [*left, *stray]:
                self.service.blobs.purge(path)
            with self.service.db.session() as session:
                session.execute(update(RunTombstoneRow).where(
                    RunTombstoneRow.fleet_id == fleet_id, RunTombstoneRow.run_id == run_id)
                    .values(blobs_left_json="[]"))


_MANIFEST_OF_NO_RUN = or_(ManifestRow.run_id == "", ~exists().where(
    RunRow.fleet_id == ManifestRow.fleet_id, RunRow.run_id == ManifestRow.run_id))
_EVIDENCE_OF_NO_ARTIFACT = or_(EvidenceRow.artifact_id == "", ~exists().where(
    ArtifactRow.fleet_id == EvidenceRow.fleet_id,
    ArtifactRow.artifact_id == EvidenceRow.artifact_id))
_LOOSE: tuple[tuple[str, Any, Any, Any, Any, Any, tuple[Any, ...]], ...] = (
    ("manifest", ManifestRow, ManifestRow.manifest_id, _MANIFEST_OF_NO_RUN,
     ManifestRow.content_hash, ManifestRow.format, (ManifestRow.content_json,)),
    ("evidence", EvidenceRow, EvidenceRow.evidence_id, _EVIDENCE_OF_NO_ARTIFACT,
     literal(EVIDENCE_LEAF), literal(2), (EvidenceRow.chunk_id, EvidenceRow.metadata_json)),
)
"""The items of no run a find lists, in this order: (kind, table, id column, of no run,
leaf, format, what is searched for the text). Of no run: built for none, or for a run no
longer stored (a manifest or evidence left by a write that raced its run's erasure before
those writes held the run). Evidence has no format: its id never derived from what it says."""


def _check_run_leaf(session: Session, order: ErasureOrder, run_id: str, leaf: str) -> None:
    run = session.scalars(select(RunRow).where(RunRow.fleet_id == order.fleet_id,
                                               RunRow.run_id == run_id)).first()
    if run is not None:
        _check_leaf(order, run_id, run.head_hash, leaf)


def _check_leaf(order: ErasureOrder, run_id: str, head_hash: str, leaf: str) -> None:
    if run_leaf(head_hash) != leaf:
        raise FailedPrecondition(
            f"run {run_id} has head hash {run_leaf(head_hash)[:16]}… but erasure "
            f"{order.erasure_id} lists {leaf[:16]}…: the run moved on since the erasure was "
            "recorded; record a new erasure", reason="ERASURE_MISMATCH",
            metadata={"run_id": run_id})


def _past(created: InstrumentedAttribute[int], key: InstrumentedAttribute[str],
          after: ItemOrder, kind: int) -> ColumnElement[bool]:
    """The rows of the ``kind``-th table of loose items past ``after`` in (created, id) order
    (all of them when ``after`` is in an earlier table)."""
    if after[0] != kind:
        return true()
    return or_(created > after[1], and_(created == after[1], key > after[2]))


def _erase_loose(session: Session, order: ErasureOrder) -> ErasedLoose:
    """Delete the order's manifests and evidence (the caller commits). Every item is checked
    before any is deleted: a manifest whose content hash is not the one listed refuses the
    whole call. One no longer stored was erased before (a find listed it); an imported
    erasure's item this service never held is nothing to do."""
    fleet_id = order.fleet_id
    rows: list[ManifestRow | EvidenceRow] = []
    manifests = already = 0
    for kind, item_id, leaf in order.items:
        row: ManifestRow | EvidenceRow | None
        if kind == "manifest":
            row = session.get(ManifestRow, (fleet_id, item_id))
            stored = row.content_hash if row is not None else ""
            owner = row.run_id if row is not None and row.run_id and session.get(
                RunRow, (fleet_id, row.run_id)) is not None else ""
        elif kind == "evidence":
            row, stored = session.get(EvidenceRow, (fleet_id, item_id)), EVIDENCE_LEAF
            owner = row.artifact_id if row is not None and row.artifact_id and session.scalar(
                select(ArtifactRow.artifact_id).where(
                    ArtifactRow.fleet_id == fleet_id,
                    ArtifactRow.artifact_id == row.artifact_id)) is not None else ""
        else:
            continue
        if row is None:
            already += 0 if order.imported else 1
            continue
        if owner:  # a kept run's: it goes with its run, never on its own
            raise FailedPrecondition(
                f"{kind} {item_id} belongs to {'run' if kind == 'manifest' else 'artifact'} "
                f"{owner}, which is kept: erase that run instead (engram forget --run); "
                f"nothing of erasure {order.erasure_id} was erased", reason="ERASURE_MISMATCH",
                metadata={"kind": kind, "id": item_id})
        if stored != leaf:
            raise leaf_mismatch(order, kind, item_id, stored, leaf)
        manifests += kind == "manifest"
        rows.append(row)
    for row in rows:
        if isinstance(row, ManifestRow):  # what finds it by its content goes with it
            session.execute(delete(ManifestKeyRow).where(
                ManifestKeyRow.fleet_id == fleet_id,
                ManifestKeyRow.manifest_id == row.manifest_id))
        session.delete(row)
    session.flush()
    return ErasedLoose(manifests, len(rows) - manifests, already)


def _count(session: Session, table: type[EventRow] | type[SnapshotRow] | type[ManifestRow],
           fleet_id: str, run_id: str) -> int:
    return int(session.scalar(select(func.count()).select_from(table).where(
        table.fleet_id == fleet_id, table.run_id == run_id)) or 0)
