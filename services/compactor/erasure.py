"""IterationEraser: the compactor's part of ``engram forget --run`` (docs/erasure.md).

For each run governance's erasure lists as ``iterations``, under the run's finisher lock
(no seal or snapshot races it): one transaction deletes the run's head, warm lines, hot
ring, segment and snapshot bookkeeping, pins and request ids and leaves a tombstone (last
iteration, head hash, the erasure); then every blob under the run's prefix (sealed
segments, index files, cold snapshots) is purged with all its S3 versions, and the cached
segments dropped. A tombstone whose blobs are not all gone says so; a rerun finishes. The
append path refuses an erased run in its own transaction.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from services.common.blobstore import BlobStore
from services.common.db import Database
from services.common.erasure_source import (
    ErasureOrder,
    ErasureSource,
    PurgeThrottle,
    TextScans,
    recorded_erasure,
    selection_limit,
    still_wanted,
)
from services.common.errors import FailedPrecondition, NotFound
from services.common.find_cursor import FindCursor, runs_from
from services.common.text_match import bytes_hold, holds, json_holds, needle_of
from services.compactor.domain.blob_layout import run_prefix
from services.compactor.repository import holding_run
from services.compactor.service import IterationLog
from services.compactor.tables import (
    HotRow,
    IterationRequestRow,
    PinRow,
    RunRow,
    RunTombstoneRow,
    SegmentRow,
    SnapshotRow,
    WarmLineRow,
)

log = logging.getLogger("engram.compactor.erasure")

RUN_TABLES = (WarmLineRow, HotRow, SegmentRow, SnapshotRow, PinRow, IterationRequestRow)
PURGED_TABLES = ("compactor_runs", "compactor_warm_lines", "compactor_hot",
                 "compactor_segments", "compactor_snapshots", "compactor_pins",
                 "compactor_iteration_requests")




INDEX_FILES = "/warm/index/"
CHAIN_FIELDS = frozenset({"v", "salt", "summaryCommitment", "detailDigest", "prevHash", "hash"})
"""A warm line's fields that only chain it: random salts and hex digests. A text is looked for
in the rest, so a short number or hex fragment (``4711``) does not name nearly every run by
matching a salt or a hash somewhere in its log."""


def line_holds(text: str, needle: str) -> bool:
    """A warm line (JSON) holds the text in a field other than :data:`CHAIN_FIELDS`; a line
    that does not parse is searched whole (a damaged line is rather found than missed)."""
    try:
        fields = json.loads(text)
    except ValueError:
        return json_holds(text, needle)
    if not isinstance(fields, dict):
        return json_holds(text, needle)
    content = {k: v for k, v in fields.items() if k not in CHAIN_FIELDS}
    return holds(json.dumps(content, ensure_ascii=False), needle) or holds(
        json.dumps(content), needle)


def blob_holds(key: str, chunks: Iterator[bytes], needle: str) -> bool:
    """A sealed segment line by line and a cold snapshot without its summary's chain fields
    (:func:`line_holds`); anything else, or a file that does not parse, as bytes."""
    if key.endswith(".gz"):
        data = gzip.decompress(b"".join(chunks))
        try:
            document = json.loads(data)
            summary = document["summary"]
            document["summary"] = {k: v for k, v in summary.items() if k not in CHAIN_FIELDS}
        except (ValueError, TypeError, KeyError, AttributeError):
            return bytes_hold(iter([data]), needle)
        return holds(json.dumps(document, ensure_ascii=False), needle) or holds(
            json.dumps(document), needle)
    if key.endswith(".jsonl"):
        return any(line_holds(line, needle) for line in _lines(chunks))
    return bytes_hold(chunks, needle)


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """A segment's lines as they stream in (a segment may be larger than memory is meant for)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line:
                yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


@dataclass(frozen=True)
class FoundLog:
    run_id: str
    head_hash: str
    last_iteration: int


@dataclass(frozen=True)
class ForgottenIterations:
    run_id: str
    last_iteration: int
    head_hash: str
    blobs: int


class IterationEraser:
    def __init__(self, iterations: IterationLog, database: Database, blobs: BlobStore,
                 source: ErasureSource | None) -> None:
        self.iterations = iterations
        self.db = database
        self.blobs = blobs
        self.source = source
        self._purge_throttle = PurgeThrottle()
        self._scans = TextScans()

    def erase(self, fleet_id: str, erasure_id: str,
              now_us: int) -> tuple[list[ForgottenIterations], int]:
        order = recorded_erasure(self.source, "compactor", erasure_id, fleet_id)
        erased: list[ForgottenIterations] = []
        already = 0
        for kind, run_id, leaf in order.items:
            if kind != "iterations":
                continue
            with self.iterations.run_lock(fleet_id, run_id):
                # Appends wait: the head stays current.
                with holding_run(self.db, fleet_id, run_id) as session:
                    tombstone = session.get(RunTombstoneRow, (fleet_id, run_id))
                    if tombstone is not None:
                        already += 1
                        head = None
                    else:
                        head = self._tombstone(session, order, run_id, leaf, now_us)
                if head is not None:
                    self._purge_throttle.owe()
                purged = self._purge_blobs(fleet_id, run_id)
            if head is not None:
                erased.append(ForgottenIterations(run_id, head[0], head[1], purged))
        self._purge_throttle.purge(lambda: self.db.vacuum(PURGED_TABLES))
        if erased:
            log.info("iteration logs erased", extra={"erasure_id": erasure_id,
                                                     "fleet_id": fleet_id, "runs": len(erased)})
        return erased, already

    def find(self, fleet_id: str, match: str, limit: int,
             active: Callable[[], bool] = lambda: True,
             start: FindCursor | None = None) -> tuple[list[FoundLog], FindCursor | None]:
        """The fleet's iteration logs holding ``match`` (oldest run first, from ``start``): hot
        details, warm lines, and every blob of the run (sealed segments, index files, cold
        snapshots, gzip read through); stops when ``active`` says the caller has gone. Returns
        the logs and where the next page starts (None: no more)."""
        needle = needle_of(match)
        limit = selection_limit(limit)
        with self._scans.slot("FindIterationLogs"):
            return self._find(fleet_id, needle, limit, active, start)

    def _find(self, fleet_id: str, needle: str, limit: int, active: Callable[[], bool],
              start: FindCursor | None) -> tuple[list[FoundLog], FindCursor | None]:
        with self.db.session() as session:
            runs = session.execute(select(RunRow.run_id, RunRow.head_hash, RunRow.last_iter,
                                          RunRow.created_us)
                                   .where(RunRow.fleet_id == fleet_id,
                                          runs_from(RunRow.created_us, RunRow.run_id, start))
                                   .order_by(RunRow.created_us, RunRow.run_id)).all()
        found: list[FoundLog] = []
        for run_id, head_hash, last_iter, created_us in runs:
            still_wanted(active)
            if self._holds(fleet_id, run_id, needle):
                if len(found) == limit:
                    return found, FindCursor(created_us, run_id)
                found.append(FoundLog(run_id, head_hash, int(last_iter)))
        return found, None

    def _holds(self, fleet_id: str, run_id: str, needle: str) -> bool:
        with self.db.session() as session:
            hot = session.execute(select(HotRow.line, HotRow.detail_json, HotRow.guardrails_json)
                                  .where(HotRow.fleet_id == fleet_id, HotRow.run_id == run_id))
            for line, detail, guardrails in hot:
                if (line_holds(line, needle) or json_holds(detail, needle)
                        or json_holds(guardrails, needle)):
                    return True
            warm = session.scalars(select(WarmLineRow.line).where(
                WarmLineRow.fleet_id == fleet_id, WarmLineRow.run_id == run_id))
            if any(line_holds(line, needle) for line in warm):
                return True
        for key in self.blobs.list(run_prefix(fleet_id, run_id) + "/"):
            if INDEX_FILES in key:  # segment keys, sizes and hashes: nothing recorded
                continue
            try:
                if blob_holds(key, self.blobs.open(key), needle):
                    return True
            except NotFound:  # deleted since it was listed (an older index, a retired snapshot)
                continue
        return False

    def _tombstone(self, session: Session, order: ErasureOrder, run_id: str, leaf: str,
                   now_us: int) -> tuple[int, str] | None:
        fleet_id = order.fleet_id
        run = session.get(RunRow, (fleet_id, run_id))
        if run is None:
            # Nothing recorded here. An imported erasure (a bundle's) keeps the id erased all
            # the same, so a bundle made before the erasure cannot bring the log back; one
            # recorded here does not (a governor could otherwise take any future run id).
            if order.imported and self.db.insert_once(session, RunTombstoneRow, dict(
                    fleet_id=fleet_id, run_id=run_id, last_iter=0, head_hash=leaf,
                    erasure_id=order.erasure_id, erased_us=now_us,
                    erased_by=order.requested_by, blobs_left=True)):
                return 0, leaf
            return None
        if run.head_hash != leaf:
            raise FailedPrecondition(
                f"run {run_id} has iteration head {run.head_hash[:16]}… but erasure "
                f"{order.erasure_id} lists {leaf[:16]}…: iterations were recorded since; record "
                "a new erasure", reason="ERASURE_MISMATCH", metadata={"run_id": run_id})
        for table in RUN_TABLES:
            session.execute(delete(table).where(table.fleet_id == fleet_id,
                                                table.run_id == run_id))
        session.execute(insert(RunTombstoneRow).values(
            fleet_id=fleet_id, run_id=run_id, last_iter=run.last_iter, head_hash=run.head_hash,
            erasure_id=order.erasure_id, erased_us=now_us, erased_by=order.requested_by,
            blobs_left=True))
        session.delete(run)
        return run.last_iter, run.head_hash

    def _purge_blobs(self, fleet_id: str, run_id: str) -> int:
        with self.db.session() as session:
            row = session.get(RunTombstoneRow, (fleet_id, run_id))
            if row is None or not row.blobs_left:
                return 0
        prefix = run_prefix(fleet_id, run_id) + "/"
        keys = list(self.blobs.list(prefix))
        for key in keys:
            self.blobs.purge(key)
        self.iterations.drop_cached(prefix)
        with self.db.session() as session:
            session.execute(update(RunTombstoneRow).where(
                RunTombstoneRow.fleet_id == fleet_id, RunTombstoneRow.run_id == run_id)
                .values(blobs_left=False))
        return len(keys)
