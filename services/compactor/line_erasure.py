"""Single iterations of a kept log erased in place (``engram forget --match``; docs/erasure.md).

An erasure item ``iteration`` (id ``<run_id>:<n>``, leaf the line's hash) names a format-2 warm
line. Under the run's finisher lock (no seal or snapshot races it) and in one transaction that
holds the run as an append does: the line becomes its tombstone (:meth:`WarmLine.tombstone`:
chain fields and the erasure, the seed's fields and salt gone) where it is kept, in the database
or in a sealed segment, which is written again under a new key with a new index file; its hot
ring entry, request ids, pins and cold snapshot are deleted. After the commit the replaced
segment, the cold snapshot and every index file but the current one are purged (all S3
versions), and so is any blob under the run's warm or cold prefix that nothing lists (what a
crash between a write and its commit left): a rerun of the erasure finishes a purge a crash
cut short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from services.common.blobstore import BlobStore
from services.common.db import Database
from services.common.erasure_source import ErasureOrder, run_item_key
from services.common.errors import FailedPrecondition, NotFound
from services.compactor.domain.blob_layout import (
    SegmentEntry,
    index_key,
    run_prefix,
    snapshot_key,
)
from services.compactor.domain.warm_chain import LINE_FORMAT, WarmLine
from services.compactor.repository import holding_run
from services.compactor.service import IterationLog
from services.compactor.tables import (
    HotRow,
    PinRow,
    RunRow,
    RunTombstoneRow,
    SegmentRow,
    SnapshotRow,
    WarmLineRow,
)

ITEM_KIND = "iteration"


def in_place_items(order: ErasureOrder) -> dict[str, list[tuple[int, str]]]:
    """The order's iterations by run (in the order listed): (iteration, leaf)."""
    runs: dict[str, list[tuple[int, str]]] = {}
    for kind, item_id, leaf in order.items:
        if kind == ITEM_KIND:
            run_id, iteration = run_item_key(item_id)
            runs.setdefault(run_id, []).append((iteration, leaf))
    return runs


@dataclass(frozen=True)
class LinesErased:
    erased: int
    already: int


class LineEraser:
    def __init__(self, iterations: IterationLog, database: Database, blobs: BlobStore) -> None:
        self.iterations = iterations
        self.db = database
        self.blobs = blobs

    def erase(self, order: ErasureOrder, run_id: str, items: Sequence[tuple[int, str]],
              now_us: int, owe: Callable[[], None]) -> LinesErased:
        """Tombstone ``items`` of the run's log; the caller holds the run's lock. ``owe`` is
        called right after the commit when a line was erased: the store's purge is owed from
        then on, whatever fails after."""
        fleet_id = order.fleet_id
        with holding_run(self.db, fleet_id, run_id) as session:
            if session.get(RunTombstoneRow, (fleet_id, run_id)) is not None:
                return LinesErased(0, len(items))  # the whole log went before
            run = session.get(RunRow, (fleet_id, run_id))
            if run is None:
                if order.imported:  # a bundle's erasure of a log never held here
                    return LinesErased(0, 0)
                raise NotFound(f"run {run_id} has no iteration log in fleet {fleet_id}",
                               reason="RUN_NOT_FOUND", metadata={"run_id": run_id})
            erased, already, purge = self._tombstone(session, order, run, items, now_us)
        if erased:
            owe()
        for key in purge:
            self.blobs.purge(key)
            self.iterations.drop_cached(key)
        self._sweep(fleet_id, run_id)
        return LinesErased(erased, already)

    def _tombstone(self, session: Session, order: ErasureOrder, run: RunRow,
                   items: Sequence[tuple[int, str]],
                   now_us: int) -> tuple[int, int, list[str]]:
        fleet_id, run_id = run.fleet_id, run.run_id
        sealed = {row.seq: row for row in session.scalars(select(SegmentRow).where(
            SegmentRow.fleet_id == fleet_id, SegmentRow.run_id == run_id,
            SegmentRow.sealed.is_(True)))}
        segments: dict[int, list[WarmLine]] = {}
        rewritten: set[int] = set()
        erased = already = 0
        purge: list[str] = []
        for iteration, leaf in items:
            row = session.get(WarmLineRow, (fleet_id, run_id, iteration))
            seq = None
            if row is not None:
                line = WarmLine.parse(row.line)
            else:
                seq = next((s for s, e in sealed.items()
                            if e.first_iter <= iteration <= e.last_iter), None)
                if seq is None:
                    raise NotFound(f"run {run_id} has no iteration {iteration} (its log ends at "
                                   f"{run.last_iter})", reason="ITERATION_NOT_FOUND",
                                   metadata={"run_id": run_id, "iteration": str(iteration)})
                if seq not in segments:
                    segments[seq] = self.iterations.warm.read_segment(sealed[seq].to_entry())
                line = next(x for x in segments[seq] if x.iteration == iteration)
            if line.erased:
                already += 1
                continue
            _check(order, run_id, line, leaf)
            tombstone = line.tombstone(order.erasure_id, now_us, order.requested_by)
            if row is not None:
                row.line = tombstone.text()
            else:
                assert seq is not None
                segments[seq] = [tombstone if x.iteration == iteration else x
                                 for x in segments[seq]]
                rewritten.add(seq)
            # its request ids are kept: a retry of the call that recorded it is answered
            # ITERATION_ERASED, not recorded again as the next iteration
            for table in (HotRow, PinRow):
                session.execute(delete(table).where(
                    table.fleet_id == fleet_id, table.run_id == run_id,
                    table.iteration == iteration))
            snapshot = session.get(SnapshotRow, (fleet_id, run_id, iteration))
            if snapshot is not None:
                session.delete(snapshot)
            # also when retired before: a versioned bucket may keep it as a noncurrent version
            purge.append(snapshot_key(fleet_id, run_id, iteration))
            erased += 1
        if rewritten:
            purge += self._rewrite(session, run, sealed, segments, rewritten)
        return erased, already, purge

    def _rewrite(self, session: Session, run: RunRow, sealed: dict[int, SegmentRow],
                 segments: dict[int, list[WarmLine]], rewritten: set[int]) -> list[str]:
        """Write the segments holding tombstones again, and an index file listing them; their
        rows follow in the caller's transaction. The replaced files, to purge after it."""
        fleet_id, run_id = run.fleet_id, run.run_id
        replaced = []
        entries: list[SegmentEntry] = []
        for seq in sorted(sealed):
            entry = sealed[seq].to_entry()
            if seq in rewritten:
                new = self.iterations.warm.rewrite_segment(fleet_id, run_id, entry,
                                                           segments[seq])
                replaced.append(entry.key)
                row = sealed[seq]
                row.key, row.size_bytes, row.sha256 = new.key, new.bytes, new.sha256
                entry = new
            entries.append(entry)
        version = run.index_version + 1
        self.iterations.warm.discard_index(fleet_id, run_id, version)  # a crash's, unlisted
        self.iterations.warm.write_index(fleet_id, run_id, version, entries)
        run.index_version = version
        return replaced

    def _sweep(self, fleet_id: str, run_id: str) -> None:
        """Purge the run's warm and cold blobs nothing lists: replaced segments and index
        files, erased snapshots (a crash after the commit left them), a crashed seal's or
        snapshot's file (its finisher writes it again)."""
        with self.db.session() as session:
            run = session.get(RunRow, (fleet_id, run_id))
            if run is None:
                return
            listed = set(session.scalars(select(SegmentRow.key).where(
                SegmentRow.fleet_id == fleet_id, SegmentRow.run_id == run_id)))
            listed |= set(session.scalars(select(SnapshotRow.key).where(
                SnapshotRow.fleet_id == fleet_id, SnapshotRow.run_id == run_id)))
            if run.index_version:
                listed.add(index_key(fleet_id, run_id, run.index_version))
        prefix = run_prefix(fleet_id, run_id)
        stale = [key for where in ("/warm/", "/cold/")
                 for key in self.blobs.list(prefix + where) if key not in listed]
        for key in stale:
            self.blobs.purge(key)
            self.iterations.drop_cached(key)


def _check(order: ErasureOrder, run_id: str, line: WarmLine, leaf: str) -> None:
    where = {"run_id": run_id, "iteration": str(line.iteration)}
    if line.hash != leaf:
        raise FailedPrecondition(
            f"iteration {line.iteration} of run {run_id} has hash {line.hash[:16]}… but erasure "
            f"{order.erasure_id} lists {leaf[:16]}…", reason="ERASURE_MISMATCH", metadata=where)
    if line.format != LINE_FORMAT:
        raise FailedPrecondition(
            f"iteration {line.iteration} of run {run_id} is a format-1 line: it cannot be "
            "erased in place (its hash would confirm a guess of it); erase the whole log "
            "(engram forget --run, or --match with --whole-runs)", reason="FORMAT1_LINE",
            metadata=where)
