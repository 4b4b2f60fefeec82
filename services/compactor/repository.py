"""CompactorRepository: the compactor's own store (SQLite or Postgres, same contract).

Each method is one transaction. Appends arrive in groups (group commit) and run
on SQLAlchemy Core with prepared statements: per iteration one head read (the
first of its run in the group), the guarded head update, the line, the hot
entry and the hot-ring trim. The head is read inside the write transaction
(``BEGIN IMMEDIATE`` on SQLite, ``FOR UPDATE`` on Postgres) and its update is
still guarded by the iteration it was planned from; a conflict surfaces as a
retry (or :class:`ConcurrentAppend`) and the caller re-plans.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Connection, Table, and_, bindparam, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError as SqlIntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from services.common.db import Database
from services.common.errors import EngramError, FailedPrecondition
from services.compactor.domain.blob_layout import SegmentEntry, snapshot_key
from services.compactor.domain.memory_policy import PolicyRun
from services.compactor.domain.model import (
    AppendOutcome,
    AppendPlan,
    AppendRequest,
    HotEntry,
    Pin,
    RunHead,
    RunView,
    SnapshotInfo,
    SnapshotState,
)
from services.compactor.domain.warm_chain import WarmLine
from services.compactor.tables import (
    HotRow,
    IterationRequestRow,
    PinRow,
    PolicyRunRow,
    RunRow,
    RunTombstoneRow,
    SegmentRow,
    SnapshotRow,
    WarmLineRow,
)

Planner = Callable[[AppendRequest, RunHead | None], AppendPlan | None]

_RUNS = cast(Table, RunRow.__table__)
_LINES = cast(Table, WarmLineRow.__table__)
_HOT = cast(Table, HotRow.__table__)
_SEGMENTS = cast(Table, SegmentRow.__table__)
_SNAPSHOTS = cast(Table, SnapshotRow.__table__)
_REQUESTS = cast(Table, IterationRequestRow.__table__)

# Built once: executing them skips statement construction, and their compiled form is cached.
_SELECT_HEAD = select(_RUNS).where(
    _RUNS.c.fleet_id == bindparam("fleet"), _RUNS.c.run_id == bindparam("run"))
_LOCK_HEAD = _SELECT_HEAD.with_for_update()
_ERASED = select(RunTombstoneRow.erasure_id).where(
    RunTombstoneRow.fleet_id == bindparam("fleet"), RunTombstoneRow.run_id == bindparam("run"))
_ADVANCE_HEAD = update(_RUNS).where(
    _RUNS.c.fleet_id == bindparam("k_fleet"), _RUNS.c.run_id == bindparam("k_run"),
    _RUNS.c.last_iter == bindparam("k_last"),
).values(last_iter=bindparam("v_last"), head_hash=bindparam("v_hash"),
         active_seq=bindparam("v_seq"), active_bytes=bindparam("v_bytes"),
         pending_work=bindparam("v_pending"), updated_us=bindparam("v_now"))
_SELECT_REQUEST = select(_REQUESTS.c.iteration).where(
    _REQUESTS.c.fleet_id == bindparam("fleet"), _REQUESTS.c.run_id == bindparam("run"),
    _REQUESTS.c.request_id == bindparam("request"))
_INSERT_REQUEST = insert(_REQUESTS)
_INSERT_LINE = insert(_LINES)
_INSERT_HOT = insert(_HOT)
_INSERT_SEGMENT = insert(_SEGMENTS)
_INSERT_SNAPSHOT = insert(_SNAPSHOTS)
_TRIM_HOT = delete(_HOT).where(
    _HOT.c.fleet_id == bindparam("fleet"), _HOT.c.run_id == bindparam("run"),
    _HOT.c.iteration <= bindparam("through"),
    _HOT.c.iteration.not_in(select(_SNAPSHOTS.c.iteration).where(
        _SNAPSHOTS.c.fleet_id == bindparam("fleet"), _SNAPSHOTS.c.run_id == bindparam("run"),
        _SNAPSHOTS.c.state == SnapshotState.PENDING.value)))


class ConcurrentAppend(Exception):
    """Another writer moved the run's head first; re-read it and plan again."""


MAX_PINS_PER_RUN = 1000
"""Pins one run holds at most (found by review on 2026-11-29: they were uncapped)."""


def _now_us() -> int:
    return time.time_ns() // 1000


def _run_key(model: type[RunRow] | type[WarmLineRow] | type[HotRow] | type[SegmentRow]
             | type[SnapshotRow] | type[PinRow], fleet_id: str, run_id: str,
             ) -> ColumnElement[bool]:
    return and_(model.fleet_id == fleet_id, model.run_id == run_id)


def _head_of(row: Any) -> RunHead:
    return RunHead(row.fleet_id, row.run_id, row.last_iter, row.head_hash, row.active_seq,
                   row.active_bytes, row.index_version, row.pending_work)


@contextmanager
def holding_run(db: Database, fleet_id: str, run_id: str) -> Iterator[Session]:
    """A write transaction that holds the run as an append does (SQLite's write lock from
    its first statement, the head row ``FOR UPDATE`` on Postgres): appends to the run wait
    for it, and what it reads is current until it commits."""
    with db.writing() as session:
        session.execute(_LOCK_HEAD, {"fleet": fleet_id, "run": run_id})
        yield session


def _sealed(session: Session, fleet_id: str, run_id: str) -> list[SegmentEntry]:
    rows = session.scalars(select(SegmentRow).where(
        _run_key(SegmentRow, fleet_id, run_id), SegmentRow.sealed.is_(True))
        .order_by(SegmentRow.seq))
    return [r.to_entry() for r in rows]


def _db_lines(session: Session, fleet_id: str, run_id: str, first: int,
              last: int | None) -> list[WarmLine]:
    query = select(WarmLineRow).where(_run_key(WarmLineRow, fleet_id, run_id),
                                      WarmLineRow.iteration >= first)
    if last is not None:
        query = query.where(WarmLineRow.iteration <= last)
    return [r.to_entity() for r in session.scalars(query.order_by(WarmLineRow.iteration))]


def _snapshots(session: Session, fleet_id: str, run_id: str,
               state: SnapshotState | None) -> list[SnapshotInfo]:
    query = select(SnapshotRow).where(_run_key(SnapshotRow, fleet_id, run_id))
    if state is not None:
        query = query.where(SnapshotRow.state == state.value)
    return [r.to_entity() for r in session.scalars(query.order_by(SnapshotRow.iteration))]


class CompactorRepository:
    def __init__(self, database: Database) -> None:
        self.db = database
        # A new run's row: a concurrent creator makes this insert a no-op, not an error.
        dialect_insert = pg_insert if database.dialect == "postgresql" else sqlite_insert
        # RETURNING says whether it inserted (psycopg reports no rowcount for it).
        self._create_run = dialect_insert(_RUNS).on_conflict_do_nothing().returning(
            _RUNS.c.last_iter)

    # -- run head and append ------------------------------------------------

    def head(self, fleet_id: str, run_id: str) -> RunHead | None:
        with self.db.reading() as conn:  # a lost database or a full pool: a status of its own
            row = conn.execute(_SELECT_HEAD, {"fleet": fleet_id, "run": run_id}).first()
            return _head_of(row) if row is not None else None

    def runs_with_pending_work(self) -> list[tuple[str, str]]:
        with self.db.session() as session:
            rows = session.execute(select(RunRow.fleet_id, RunRow.run_id)
                                   .where(RunRow.pending_work.is_(True))).tuples()
            return list(rows)

    def append_group(self, requests: Sequence[AppendRequest],
                     plan_for: Planner) -> list[AppendOutcome]:
        """Append every request in one transaction (one commit, one fsync for the group).

        Runs are visited in key order (a stable sort keeps each run's arrival order), so two
        groups lock Postgres rows in the same order.
        """
        outcomes: list[AppendOutcome | None] = [None] * len(requests)
        order = sorted(range(len(requests)),
                       key=lambda i: (requests[i].fleet_id, requests[i].run_id))
        try:
            # The write lock before the heads are read: the reads are then current.
            with self.db.writing() as session:
                conn = session.connection()
                heads: dict[tuple[str, str], RunHead | None] = {}
                for i in order:
                    outcomes[i] = self._append_one(conn, requests[i], plan_for, heads)
        except SqlIntegrityError:
            raise ConcurrentAppend() from None
        return [cast(AppendOutcome, outcome) for outcome in outcomes]

    def _append_one(self, conn: Connection, request: AppendRequest, plan_for: Planner,
                    heads: dict[tuple[str, str], RunHead | None]) -> AppendOutcome:
        fleet_id, run_id = request.fleet_id, request.run_id
        key = (fleet_id, run_id)
        if key in heads:
            head = heads[key]
        else:
            row = conn.execute(_LOCK_HEAD, {"fleet": fleet_id, "run": run_id}).first()
            head = _head_of(row) if row is not None else None
        pending = bool(head and head.pending_work)
        if head is None:
            erased = conn.execute(_ERASED, {"fleet": fleet_id, "run": run_id}).scalar()
            if erased is not None:  # in this transaction: an erasure committing first wins
                return AppendOutcome(None, False, error=FailedPrecondition(
                    f"run {run_id!r} was erased (erasure {erased}); nothing is recorded to an "
                    "erased run: use another run id", reason="RUN_ERASED"))
        if request.request_id:
            known = conn.execute(_SELECT_REQUEST, {"fleet": fleet_id, "run": run_id,
                                                   "request": request.request_id}).scalar()
            if known is not None:
                return AppendOutcome(None, pending, recorded_iteration=int(known))
        try:
            plan = plan_for(request, head)
        except EngramError as exc:
            return AppendOutcome(None, pending, error=exc)
        if plan is None:
            return AppendOutcome(None, pending)
        line, now = plan.line, _now_us()
        if head is None:
            created = conn.execute(self._create_run, {
                "fleet_id": fleet_id, "run_id": run_id, "last_iter": line.iteration,
                "head_hash": line.hash, "active_seq": plan.seq,
                "active_bytes": plan.active_bytes, "index_version": 0,
                "pending_work": plan.pending_work, "created_us": now, "updated_us": now})
            moved = created.first() is not None
        else:
            moved = conn.execute(_ADVANCE_HEAD, {
                "k_fleet": fleet_id, "k_run": run_id, "k_last": head.last_iter,
                "v_last": line.iteration, "v_hash": line.hash, "v_seq": plan.seq,
                "v_bytes": plan.active_bytes, "v_pending": plan.pending_work,
                "v_now": now}).rowcount == 1
        if not moved:
            heads.pop(key, None)
            return AppendOutcome(None, pending, retry=True)
        text = line.text()
        if request.request_id:
            conn.execute(_INSERT_REQUEST, {"fleet_id": fleet_id, "run_id": run_id,
                                           "request_id": request.request_id,
                                           "iteration": line.iteration})
        conn.execute(_INSERT_LINE, {"fleet_id": fleet_id, "run_id": run_id,
                                    "iteration": line.iteration, "seq": plan.seq,
                                    "line": text})
        if request.detail_known:
            conn.execute(_INSERT_HOT, {"fleet_id": fleet_id, "run_id": run_id,
                                       "iteration": line.iteration, "line": text,
                                       "detail_json": request.item.detail_json,
                                       "guardrails_json": request.item.guardrails_json})
        if plan.seal_seq is not None:
            conn.execute(_INSERT_SEGMENT, {
                "fleet_id": fleet_id, "run_id": run_id, "seq": plan.seal_seq, "sealed": False,
                "key": "", "first_iter": 0, "last_iter": 0, "lines": 0, "size_bytes": 0,
                "sha256": "", "first_prev_hash": "", "last_hash": ""})
        if plan.snapshot:
            conn.execute(_INSERT_SNAPSHOT, {
                "fleet_id": fleet_id, "run_id": run_id, "iteration": line.iteration,
                "state": SnapshotState.PENDING.value, "sha256": "", "size_bytes": 0,
                "key": snapshot_key(fleet_id, run_id, line.iteration)})
        if plan.trim_through >= 1:
            conn.execute(_TRIM_HOT, {"fleet": fleet_id, "run": run_id,
                                     "through": plan.trim_through})
        heads[key] = RunHead(fleet_id, run_id, line.iteration, line.hash, plan.seq,
                             plan.active_bytes, head.index_version if head else 0,
                             plan.pending_work)
        return AppendOutcome(plan, pending)

    # -- reads ----------------------------------------------------------------

    def warm_lines(self, fleet_id: str, run_id: str, first: int = 1,
                   last: int | None = None) -> tuple[list[SegmentEntry], list[WarmLine]]:
        """The sealed segments, and the lines ``first..last`` still in the database (active
        segment and segments being sealed), read at one moment: a seal committing between two
        reads would hide its lines from both."""
        with self.db.snapshot() as session:
            return (_sealed(session, fleet_id, run_id),
                    _db_lines(session, fleet_id, run_id, first, last))

    def view(self, fleet_id: str, run_id: str) -> RunView | None:
        """The run's head, sealed segments, database lines and stored snapshots at one moment."""
        with self.db.snapshot() as session:
            row = session.execute(_SELECT_HEAD, {"fleet": fleet_id, "run": run_id}).first()
            if row is None:
                return None
            texts = session.execute(
                select(WarmLineRow.iteration, WarmLineRow.line)
                .where(_run_key(WarmLineRow, fleet_id, run_id))
                .order_by(WarmLineRow.iteration)).tuples()
            return RunView(_head_of(row), _sealed(session, fleet_id, run_id), list(texts),
                           _snapshots(session, fleet_id, run_id, SnapshotState.STORED))

    def segment_lines(self, fleet_id: str, run_id: str, seq: int) -> list[WarmLine]:
        with self.db.session() as session:
            rows = session.scalars(select(WarmLineRow).where(
                _run_key(WarmLineRow, fleet_id, run_id), WarmLineRow.seq == seq)
                .order_by(WarmLineRow.iteration))
            return [r.to_entity() for r in rows]

    def hot(self, fleet_id: str, run_id: str, iteration: int) -> HotEntry | None:
        with self.db.session() as session:
            row = session.get(HotRow, (fleet_id, run_id, iteration))
            return row.to_entity() if row else None

    def recent(self, fleet_id: str, run_id: str, below: int | None, limit: int,
               ) -> list[HotEntry]:
        """The hot ring newest first; ``below`` continues after a page."""
        with self.db.session() as session:
            head = session.get(RunRow, (fleet_id, run_id))
            if head is None:
                return []
            query = select(HotRow).where(_run_key(HotRow, fleet_id, run_id))
            if below is not None:
                query = query.where(HotRow.iteration < below)
            rows = session.scalars(query.order_by(HotRow.iteration.desc()).limit(limit))
            return [r.to_entity() for r in rows]

    def sealing_segments(self, fleet_id: str, run_id: str) -> list[int]:
        with self.db.session() as session:
            return list(session.scalars(select(SegmentRow.seq).where(
                _run_key(SegmentRow, fleet_id, run_id), SegmentRow.sealed.is_(False))
                .order_by(SegmentRow.seq)))

    def sealed_segments(self, fleet_id: str, run_id: str) -> list[SegmentEntry]:
        with self.db.session() as session:
            return _sealed(session, fleet_id, run_id)

    def complete_seal(self, fleet_id: str, run_id: str, entry: SegmentEntry,
                      index_version: int) -> None:
        """Mark the segment sealed, drop its lines from the database, bump the index version."""
        with self.db.session() as session:
            session.execute(update(SegmentRow).where(
                _run_key(SegmentRow, fleet_id, run_id), SegmentRow.seq == entry.seq).values(
                    sealed=True, key=entry.key, first_iter=entry.first_iter,
                    last_iter=entry.last_iter, lines=entry.lines, size_bytes=entry.bytes,
                    sha256=entry.sha256, first_prev_hash=entry.first_prev_hash,
                    last_hash=entry.last_hash))
            session.execute(delete(WarmLineRow).where(
                _run_key(WarmLineRow, fleet_id, run_id), WarmLineRow.seq == entry.seq))
            session.execute(update(RunRow).where(_run_key(RunRow, fleet_id, run_id))
                            .values(index_version=index_version))

    # -- snapshots, pins, retention ---------------------------------------------

    def snapshots(self, fleet_id: str, run_id: str,
                  state: SnapshotState | None = None) -> list[SnapshotInfo]:
        with self.db.session() as session:
            return _snapshots(session, fleet_id, run_id, state)

    def stored_snapshot_at_or_before(self, fleet_id: str, run_id: str,
                                     iteration: int) -> SnapshotInfo | None:
        with self.db.session() as session:
            row = session.scalars(select(SnapshotRow).where(
                _run_key(SnapshotRow, fleet_id, run_id),
                SnapshotRow.state == SnapshotState.STORED.value,
                SnapshotRow.iteration <= iteration)
                .order_by(SnapshotRow.iteration.desc()).limit(1)).first()
            return row.to_entity() if row else None

    def mark_snapshot_stored(self, fleet_id: str, run_id: str, iteration: int, sha256: str,
                             size_bytes: int) -> None:
        with self.db.session() as session:
            session.execute(update(SnapshotRow).where(
                _run_key(SnapshotRow, fleet_id, run_id), SnapshotRow.iteration == iteration)
                .values(state=SnapshotState.STORED.value, sha256=sha256, size_bytes=size_bytes))

    def mark_retiring(self, fleet_id: str, run_id: str, keep: int) -> list[SnapshotInfo]:
        """Snapshots beyond the newest ``keep`` and not pinned become RETIRING; all are returned."""
        # A pin being added commits first, or waits.
        with holding_run(self.db, fleet_id, run_id) as session:
            pinned = select(PinRow.snapshot_iteration).where(_run_key(PinRow, fleet_id, run_id))
            kept = select(SnapshotRow.iteration).where(
                _run_key(SnapshotRow, fleet_id, run_id),
                SnapshotRow.state != SnapshotState.RETIRING.value,
            ).order_by(SnapshotRow.iteration.desc()).limit(keep)
            keep_iters = set(session.scalars(kept))
            session.execute(update(SnapshotRow).where(
                _run_key(SnapshotRow, fleet_id, run_id),
                SnapshotRow.state == SnapshotState.STORED.value,
                SnapshotRow.iteration.not_in(keep_iters),
                SnapshotRow.iteration.not_in(pinned)).values(state=SnapshotState.RETIRING.value))
            rows = session.scalars(select(SnapshotRow).where(
                _run_key(SnapshotRow, fleet_id, run_id),
                SnapshotRow.state == SnapshotState.RETIRING.value).order_by(SnapshotRow.iteration))
            return [r.to_entity() for r in rows]

    def drop_snapshots(self, fleet_id: str, run_id: str, iterations: Sequence[int]) -> None:
        with self.db.session() as session:
            session.execute(delete(SnapshotRow).where(
                _run_key(SnapshotRow, fleet_id, run_id), SnapshotRow.iteration.in_(iterations),
                SnapshotRow.state == SnapshotState.RETIRING.value))

    def clear_pending(self, fleet_id: str, run_id: str) -> None:
        """Clear the flag once no snapshot is pending or retiring and every segment is sealed."""
        with holding_run(self.db, fleet_id, run_id) as session:  # appends adding work wait
            open_snapshots = session.scalar(select(func.count()).select_from(SnapshotRow).where(
                _run_key(SnapshotRow, fleet_id, run_id),
                SnapshotRow.state != SnapshotState.STORED.value))
            open_segments = session.scalar(select(func.count()).select_from(SegmentRow).where(
                _run_key(SegmentRow, fleet_id, run_id), SegmentRow.sealed.is_(False)))
            if not open_snapshots and not open_segments:
                session.execute(update(RunRow).where(_run_key(RunRow, fleet_id, run_id))
                                .values(pending_work=False))

    def add_pin(self, fleet_id: str, run_id: str, iteration: int, reason: str) -> Pin:
        """Pin an iteration; a hot iteration without a snapshot gets one (pending) to keep."""
        # No append trims the hot ring meanwhile.
        with holding_run(self.db, fleet_id, run_id) as session:
            existing = session.get(PinRow, (fleet_id, run_id, iteration))
            if existing is not None:
                return existing.to_entity()
            held = session.scalar(select(func.count()).select_from(PinRow).where(
                _run_key(PinRow, fleet_id, run_id))) or 0
            if held >= MAX_PINS_PER_RUN:
                raise FailedPrecondition(
                    f"run {run_id} holds {held} pins, the most one run may hold (each keeps a "
                    "cold snapshot from retirement, and VerifyRun reads them all)",
                    reason="PIN_LIMIT", metadata={"limit": str(MAX_PINS_PER_RUN)})
            own = session.get(SnapshotRow, (fleet_id, run_id, iteration))
            if own is not None and own.state != SnapshotState.RETIRING.value:
                target = iteration
            elif own is None and session.get(HotRow, (fleet_id, run_id, iteration)) is not None:
                session.add(SnapshotRow(fleet_id=fleet_id, run_id=run_id, iteration=iteration,
                                        state=SnapshotState.PENDING.value,
                                        key=snapshot_key(fleet_id, run_id, iteration)))
                session.execute(update(RunRow).where(_run_key(RunRow, fleet_id, run_id))
                                .values(pending_work=True))
                target = iteration
            else:
                target = session.scalar(select(func.max(SnapshotRow.iteration)).where(
                    _run_key(SnapshotRow, fleet_id, run_id),
                    SnapshotRow.state == SnapshotState.STORED.value,
                    SnapshotRow.iteration < iteration)) or 0
            row = PinRow(fleet_id=fleet_id, run_id=run_id, iteration=iteration, reason=reason,
                         snapshot_iteration=target, created_us=_now_us())
            session.add(row)
            session.flush()
            return row.to_entity()

    # -- memory policy runs -----------------------------------------------------

    def save_policy_run(self, run: PolicyRun) -> None:
        with self.db.session() as session:
            session.add(PolicyRunRow.from_entity(run))

    def policy_runs(self, fleet_id: str, after: tuple[int, str] | None,
                    limit: int) -> list[PolicyRun]:
        with self.db.session() as session:
            query = select(PolicyRunRow).where(PolicyRunRow.fleet_id == fleet_id)
            if after is not None:
                start_us, run_id = after
                query = query.where(
                    (PolicyRunRow.start_us < start_us)
                    | and_(PolicyRunRow.start_us == start_us, PolicyRunRow.id < run_id))
            query = query.order_by(PolicyRunRow.start_us.desc(), PolicyRunRow.id.desc())
            return [r.to_entity() for r in session.scalars(query.limit(limit))]
