"""IterationRepository: the compactor's own store (SQLite or Postgres, same contract).

Each method is one transaction. Appends are guarded twice: the run head is
updated only if it still names the iteration the plan was made from, and the
warm line's primary key refuses a second copy of an iteration; either
conflict surfaces as :class:`ConcurrentAppend` and the caller re-plans.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.exc import IntegrityError as SqlIntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from services.common.db import Database
from services.compactor.archive import SegmentEntry, snapshot_key
from services.compactor.memory_policy import PolicyRun
from services.compactor.model import (
    AppendPlan,
    HotEntry,
    Pin,
    RunHead,
    SnapshotInfo,
    SnapshotState,
)
from services.compactor.tables import (
    HotRow,
    PinRow,
    PolicyRunRow,
    RunRow,
    SegmentRow,
    SnapshotRow,
    WarmLineRow,
)
from services.compactor.warm_chain import WarmLine


class ConcurrentAppend(Exception):
    """Another writer moved the run's head first; re-read it and plan again."""


def _now_us() -> int:
    return time.time_ns() // 1000


def _run_key(model: type[RunRow] | type[WarmLineRow] | type[HotRow] | type[SegmentRow]
             | type[SnapshotRow] | type[PinRow], fleet_id: str, run_id: str,
             ) -> ColumnElement[bool]:
    return and_(model.fleet_id == fleet_id, model.run_id == run_id)


class IterationRepository:
    def __init__(self, database: Database) -> None:
        self.db = database

    # -- run head and append ------------------------------------------------

    def head(self, fleet_id: str, run_id: str) -> RunHead | None:
        with self.db.session() as session:
            row = session.get(RunRow, (fleet_id, run_id))
            return row.to_entity() if row else None

    def runs_with_pending_work(self) -> list[tuple[str, str]]:
        with self.db.session() as session:
            rows = session.execute(select(RunRow.fleet_id, RunRow.run_id)
                                   .where(RunRow.pending_work.is_(True))).tuples()
            return list(rows)

    def append(self, fleet_id: str, run_id: str,
               plan_for: Callable[[RunHead | None], AppendPlan], detail_json: str,
               guardrails_json: str) -> AppendPlan:
        """Line, hot entry, head and any due seal or snapshot: one transaction."""
        try:
            with self.db.session() as session:
                row = session.get(RunRow, (fleet_id, run_id))
                head = row.to_entity() if row else None
                plan = plan_for(head)
                self._apply(session, fleet_id, run_id, head, plan)
                session.add(HotRow(fleet_id=fleet_id, run_id=run_id,
                                   iteration=plan.line.iteration, line=plan.line.text(),
                                   detail_json=detail_json, guardrails_json=guardrails_json))
                session.flush()
                self._trim_hot(session, fleet_id, run_id, plan.trim_through)
                return plan
        except SqlIntegrityError:
            raise ConcurrentAppend() from None

    def _apply(self, session: Session, fleet_id: str, run_id: str, head: RunHead | None,
               plan: AppendPlan) -> None:
        line = plan.line
        now = _now_us()
        values = dict(last_iter=line.iteration, head_hash=line.hash, active_seq=plan.seq,
                      active_bytes=plan.active_bytes, pending_work=plan.pending_work,
                      updated_us=now)
        if head is None:
            session.add(RunRow(fleet_id=fleet_id, run_id=run_id, index_version=0,
                               created_us=now, **values))
            session.flush()
        else:
            result = session.execute(
                update(RunRow).where(_run_key(RunRow, fleet_id, run_id),
                                     RunRow.last_iter == head.last_iter).values(**values))
            if result.rowcount != 1:  # type: ignore[attr-defined]
                raise ConcurrentAppend()
        text = line.text()
        session.add(WarmLineRow(fleet_id=fleet_id, run_id=run_id, iteration=line.iteration,
                                seq=plan.seq, line=text))
        if plan.seal_seq is not None:
            session.add(SegmentRow(fleet_id=fleet_id, run_id=run_id, seq=plan.seal_seq,
                                   sealed=False))
        if plan.snapshot:
            session.add(SnapshotRow(fleet_id=fleet_id, run_id=run_id, iteration=line.iteration,
                                    state=SnapshotState.PENDING.value,
                                    key=snapshot_key(fleet_id, run_id, line.iteration)))
        session.flush()

    def _trim_hot(self, session: Session, fleet_id: str, run_id: str, through: int) -> None:
        if through < 1:
            return
        needed = select(SnapshotRow.iteration).where(
            _run_key(SnapshotRow, fleet_id, run_id),
            SnapshotRow.state == SnapshotState.PENDING.value)
        session.execute(delete(HotRow).where(
            _run_key(HotRow, fleet_id, run_id), HotRow.iteration <= through,
            HotRow.iteration.not_in(needed)))

    # -- reads ----------------------------------------------------------------

    def db_lines(self, fleet_id: str, run_id: str, first: int = 1,
                 last: int | None = None) -> list[WarmLine]:
        """Lines still in the database (active segment and segments being sealed)."""
        with self.db.session() as session:
            query = select(WarmLineRow).where(_run_key(WarmLineRow, fleet_id, run_id),
                                              WarmLineRow.iteration >= first)
            if last is not None:
                query = query.where(WarmLineRow.iteration <= last)
            return [r.to_entity() for r in session.scalars(query.order_by(WarmLineRow.iteration))]

    def db_line_texts(self, fleet_id: str, run_id: str) -> list[tuple[int, str]]:
        with self.db.session() as session:
            rows = session.execute(
                select(WarmLineRow.iteration, WarmLineRow.line)
                .where(_run_key(WarmLineRow, fleet_id, run_id))
                .order_by(WarmLineRow.iteration)).tuples()
            return list(rows)

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
            rows = session.scalars(select(SegmentRow).where(
                _run_key(SegmentRow, fleet_id, run_id), SegmentRow.sealed.is_(True))
                .order_by(SegmentRow.seq))
            return [r.to_entry() for r in rows]

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
            query = select(SnapshotRow).where(_run_key(SnapshotRow, fleet_id, run_id))
            if state is not None:
                query = query.where(SnapshotRow.state == state.value)
            return [r.to_entity() for r in session.scalars(query.order_by(SnapshotRow.iteration))]

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
        with self.db.session() as session:
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
        with self.db.session() as session:
            open_snapshots = session.scalar(select(func.count()).select_from(SnapshotRow).where(
                _run_key(SnapshotRow, fleet_id, run_id),
                SnapshotRow.state != SnapshotState.STORED.value))
            open_segments = session.scalar(select(func.count()).select_from(SegmentRow).where(
                _run_key(SegmentRow, fleet_id, run_id), SegmentRow.sealed.is_(False)))
            if not open_snapshots and not open_segments:
                session.execute(update(RunRow).where(_run_key(RunRow, fleet_id, run_id))
                                .values(pending_work=False))

    def pins(self, fleet_id: str, run_id: str) -> list[Pin]:
        with self.db.session() as session:
            rows = session.scalars(select(PinRow).where(_run_key(PinRow, fleet_id, run_id))
                                   .order_by(PinRow.iteration))
            return [r.to_entity() for r in rows]

    def add_pin(self, fleet_id: str, run_id: str, iteration: int, reason: str) -> Pin:
        """Pin an iteration; a hot iteration without a snapshot gets one (pending) to keep."""
        with self.db.session() as session:
            existing = session.get(PinRow, (fleet_id, run_id, iteration))
            if existing is not None:
                return existing.to_entity()
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
