"""IterationEraser: the compactor's part of ``engram forget --run`` (docs/erasure.md).

For each run governance's erasure lists as ``iterations``, under the run's finisher lock
(no seal or snapshot races it): one transaction deletes the run's head, warm lines, hot
ring, segment and snapshot bookkeeping, pins and request ids and leaves a tombstone (last
iteration, head hash, the erasure); then every blob under the run's prefix (sealed
segments, index files, cold snapshots) is purged with all its S3 versions, and the cached
segments dropped. A tombstone whose blobs are not all gone says so; a rerun finishes. The
append path refuses an erased run in its own transaction. Single iterations it lists (kind
``iteration``) are erased in place, their log kept (:mod:`services.compactor.line_erasure`).
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from services.common.blobstore import BlobStore
from services.common.commitment import is_hash
from services.common.db import Database
from services.common.erasure_source import (
    ErasureOrder,
    ErasureSource,
    PurgeThrottle,
    TextScans,
    is_erasure_id,
    recorded_erasure,
    selection_limit,
    while_wanted,
)
from services.common.errors import FailedPrecondition, NotFound
from services.common.find_cursor import FindCursor, runs_from
from services.common.text_match import (
    bytes_hold,
    decoded_holds,
    holds,
    json_holds,
    needle_of,
)
from services.common.tombstone_audit import (
    INVALID,
    NOT_IN_ERASURE,
    ErasureLookup,
    RecordedErasures,
)
from services.compactor.domain.blob_layout import run_prefix
from services.compactor.domain.warm_chain import LINE_FORMAT, WarmLine
from services.compactor.line_erasure import ITEM_KIND, LineEraser, in_place_items
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
MAX_LISTED_ITERATIONS = 10_000
"""Iterations one FindIterationLogs page lists at most (an erasure's items); a log with more
holding the text is erased whole."""
CHAIN_FIELDS = frozenset({"v", "salt", "summaryCommitment", "detailDigest", "prevHash", "hash",
                          "erasureId", "erasedUs", "erasedBy"})
"""A warm line's fields that only chain it: random salts and hex digests. A text is looked for
in the rest, so a short number or hex fragment (``4711``) does not name nearly every run by
matching a salt or a hash somewhere in its log."""


def line_holds(text: str, needle: str) -> bool:
    """A warm line (JSON) holds the text in the value of a field other than
    :data:`CHAIN_FIELDS` (never in a field's name: ``Del`` is in every line's ``netDel``); a
    line that does not parse is searched whole (a damaged line is rather found than
    missed)."""
    try:
        fields = json.loads(text)
    except ValueError:
        return json_holds(text, needle)
    if not isinstance(fields, dict):
        return json_holds(text, needle)
    return _values_hold((v for k, v in fields.items() if k not in CHAIN_FIELDS), needle)


def _recorded_holds(detail_json: str, guardrails_json: str, needle: str) -> bool:
    """A hot entry's detail or guardrails (JSON) hold the text; stored JSON that does not
    parse is searched as it is."""
    try:
        return _values_hold([json.loads(detail_json), json.loads(guardrails_json)], needle)
    except ValueError:
        return json_holds(detail_json, needle) or json_holds(guardrails_json, needle)


def _values_hold(values: Iterable[object], needle: str) -> bool:
    """One of ``values`` (a line's recorded values; a detail, whose keys are what its
    recorder wrote) holds the text, as stored or with its JSON escapes."""
    for value in values:
        if value is None:  # no detail recorded: "null" is nothing anybody wrote
            continue
        if isinstance(value, str):
            if holds(value, needle):
                return True
        elif holds(json.dumps(value), needle) or decoded_holds(value, needle):
            return True
    return False


def blob_holds(key: str, chunks: Iterator[bytes], needle: str) -> bool:
    """A sealed segment line by line and a cold snapshot without its summary's chain fields
    (:func:`line_holds`); anything else, or a file that does not parse, as bytes."""
    lines, whole = blob_hits(key, chunks, needle)
    return bool(lines) or whole


def blob_hits(key: str, chunks: Iterator[bytes], needle: str) -> tuple[list[WarmLine], bool]:
    """The lines of the iterations a blob holds the text for (a segment's lines holding it, a
    cold snapshot's summary when its iteration holds it), and whether it holds it where no
    single line can be erased (a line or file that does not parse, another kind of file)."""
    if key.endswith(".gz"):
        data = gzip.decompress(b"".join(chunks))
        try:
            document = json.loads(data)
            summary = document["summary"]
            recorded = [v for k, v in summary.items() if k not in CHAIN_FIELDS]
            recorded += [document["detail"], document["guardrails"]]
        except (ValueError, TypeError, KeyError, AttributeError):
            return [], bytes_hold(iter([data]), needle)
        # what the iteration recorded; not the document's own keys, fleet, run or iteration
        if not _values_hold(recorded, needle):
            return [], False
        try:
            return [WarmLine.from_dict(summary)], False
        except (ValueError, TypeError, KeyError):
            return [], True  # its summary is no line: the iteration cannot be named
    if key.endswith(".jsonl"):
        hits: list[WarmLine] = []
        whole = False
        for text in _lines(chunks):
            if line_holds(text, needle):
                try:
                    hits.append(WarmLine.parse(text))
                except ValueError:
                    whole = True
        return hits, whole
    return [], bytes_hold(chunks, needle)


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
class FoundIteration:
    iteration: int
    leaf_hash: str
    format: int


@dataclass(frozen=True)
class FoundLog:
    run_id: str
    head_hash: str
    last_iteration: int
    iterations: tuple[FoundIteration, ...] = ()
    """The iterations holding the text, oldest first (at most MAX_LISTED_ITERATIONS)."""
    whole_log_needed: bool = False
    """Only erasing the log whole removes it: a format-1 line holds it, something that does
    not parse does, or more iterations than one page lists."""


@dataclass
class ErasedLog:
    """A log erased whole as VerifyRun reports it: what its tombstone kept, and the audit."""

    last_iteration: int
    head_hash: str
    erasure_id: str
    problems: list[tuple[str, str]] = field(default_factory=list)
    unconfirmed: int = 0
    live: bool = False
    """The log is still recorded beside its tombstone (an append racing an imported erasure,
    or a tombstone written into the database): VerifyRun reports that and checks the log; the
    tombstone is not audited (whatever governance lists, one of the two is wrong)."""


@dataclass(frozen=True)
class ErasureDone:
    logs: list[ForgottenIterations]
    already: int
    iterations: int
    """Single iterations erased in place."""


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
        self._recorded = RecordedErasures()
        self._scans = TextScans()

    def erase(self, fleet_id: str, erasure_id: str, now_us: int) -> ErasureDone:
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
        lines = LineEraser(self.iterations, self.db, self.blobs)
        in_place = 0
        for run_id, items in in_place_items(order).items():
            with self.iterations.run_lock(fleet_id, run_id):
                done = lines.erase(order, run_id, items, now_us, self._purge_throttle.owe)
            in_place += done.erased
            already += done.already
        self._purge_throttle.purge(lambda: self.db.vacuum(PURGED_TABLES))
        if erased or in_place:
            log.info("iteration logs erased", extra={"erasure_id": erasure_id,
                                                     "fleet_id": fleet_id, "runs": len(erased),
                                                     "iterations": in_place})
        return ErasureDone(erased, already, in_place)

    def check_tombstones(self, fleet_id: str, run_id: str, lines: Sequence[WarmLine]) -> None:
        """An iteration erased in place (a tombstone) is imported only when an erasure
        governance holds for this fleet lists it under its kept hash and the tombstone names
        its requester as eraser: nobody plants a tombstone to keep an iteration's content away
        or names another eraser (FAILED_PRECONDITION TOMBSTONE_NOT_IN_ERASURE)."""
        listed: dict[str, set[tuple[str, str, str]]] = {}
        requested: dict[str, str] = {}
        for line in lines:
            if not line.erased:
                continue
            if line.erasure_id not in listed:
                order = recorded_erasure(self.source, "compactor", line.erasure_id, fleet_id)
                listed[line.erasure_id] = set(order.items)
                requested[line.erasure_id] = order.requested_by
            item_id = f"{run_id}:{line.iteration}"
            if line.erased_by != requested[line.erasure_id]:
                raise FailedPrecondition(
                    f"iteration {item_id} is a tombstone of erasure {line.erasure_id}, which "
                    f"{requested[line.erasure_id]!r} requested, not {line.erased_by!r}",
                    reason="TOMBSTONE_NOT_IN_ERASURE",
                    metadata={"id": item_id, "erasure_id": line.erasure_id})
            if (ITEM_KIND, item_id, line.hash) not in listed[line.erasure_id]:
                raise FailedPrecondition(
                    f"iteration {item_id} is a tombstone of erasure {line.erasure_id}, which "
                    "does not list it under that hash; import the fleet's erasures first",
                    reason="TOMBSTONE_NOT_IN_ERASURE",
                    metadata={"id": item_id, "erasure_id": line.erasure_id})

    def audit(self, fleet_id: str, run_id: str,
              tombstones: Sequence[WarmLine]) -> tuple[list[tuple[str, str]], int]:
        """VerifyRun's check of the log's tombstones against governance: each must be listed,
        under the hash it kept, by the erasure it names (anyone able to write the database
        could blank a line, name an erasure and leave a chain that still verifies; found by
        review on 2026-11-29). Returns the problems and how many could not be confirmed
        (governance not reachable)."""
        lookup = ErasureLookup(self.source, fleet_id, log, recorded=self._recorded)
        problems: list[tuple[str, str]] = []
        unconfirmed = 0
        for line in tombstones:
            listed = lookup.lists(line.erasure_id, (ITEM_KIND,), f"{run_id}:{line.iteration}",
                                  line.hash)
            if listed is None:
                unconfirmed += 1
            elif not listed:
                problems.append((f"iteration {line.iteration}", f"tombstone of erasure "
                                 f"{line.erasure_id}, which does not list it under its hash "
                                 f"({NOT_IN_ERASURE})"))
        lookup.report_unconfirmed(unconfirmed)
        return problems, unconfirmed

    def erased_log(self, fleet_id: str, run_id: str) -> ErasedLog | None:
        """VerifyRun of a log erased whole: its tombstone, checked against the erasure it
        names as :meth:`audit` checks single iterations (anyone able to write the database
        could delete a log and leave a tombstone naming an erasure); None when the log was
        not erased."""
        with self.db.session() as session:
            row = session.get(RunTombstoneRow, (fleet_id, run_id))
            if row is None:
                return None
            erased = ErasedLog(row.last_iter, row.head_hash, row.erasure_id,
                               live=session.get(RunRow, (fleet_id, run_id)) is not None)
            well_formed = (is_erasure_id(row.erasure_id) and row.erased_us > 0
                           and is_hash(row.head_hash))
        if erased.live:  # VerifyRun reports the tombstone beside the log, then checks the log
            return erased
        if not well_formed:
            erased.problems.append(("log tombstone", f"not a tombstone's form: no erasure id, "
                                    f"erase time or head hash as an erasure leaves ({INVALID})"))
            self.iterations.integrity_failures.add(INVALID)
            return erased
        lookup = ErasureLookup(self.source, fleet_id, log, recorded=self._recorded)
        listed = lookup.lists(row.erasure_id, ("iterations",), run_id, row.head_hash)
        if listed is None:
            erased.unconfirmed = 1
        elif not listed:
            erased.problems.append(("log tombstone", f"of erasure {row.erasure_id}, which does "
                                    f"not list the log under its head ({NOT_IN_ERASURE})"))
            self.iterations.integrity_failures.add(NOT_IN_ERASURE)
        lookup.report_unconfirmed(erased.unconfirmed)
        return erased

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
        listed = 0
        for run_id, head_hash, last_iter, created_us in while_wanted(runs, active):
            hits, whole = self._holding(fleet_id, run_id, needle)
            if hits or whole:
                whole = whole or len(hits) > MAX_LISTED_ITERATIONS or any(
                    line.format != LINE_FORMAT for line in hits.values())
                iterations = tuple(FoundIteration(i, hits[i].hash, hits[i].format)
                                   for i in sorted(hits)[:MAX_LISTED_ITERATIONS])
                if len(found) == limit or (
                        found and listed + len(iterations) > MAX_LISTED_ITERATIONS):
                    return found, FindCursor(created_us, run_id)
                listed += len(iterations)
                found.append(FoundLog(run_id, head_hash, int(last_iter), iterations, whole))
        return found, None

    def _holding(self, fleet_id: str, run_id: str,
                 needle: str) -> tuple[dict[int, WarmLine], bool]:
        """The run's iterations holding the text (their lines, by iteration: hot details, warm
        lines, sealed segments, cold snapshots), and whether it is held where only erasing the
        whole log removes it (:func:`blob_hits`)."""
        hits: dict[int, WarmLine] = {}
        whole = False

        def hit(text: str) -> None:
            nonlocal whole
            try:
                line = WarmLine.parse(text)
            except ValueError:
                whole = True
                return
            if not line.erased:
                hits.setdefault(line.iteration, line)

        with self.db.session() as session:
            hot = session.execute(select(HotRow.line, HotRow.detail_json, HotRow.guardrails_json)
                                  .where(HotRow.fleet_id == fleet_id, HotRow.run_id == run_id))
            for line, detail, guardrails in hot:
                if line_holds(line, needle) or _recorded_holds(detail, guardrails, needle):
                    hit(line)
            warm = session.scalars(select(WarmLineRow.line).where(
                WarmLineRow.fleet_id == fleet_id, WarmLineRow.run_id == run_id))
            for line in warm:
                if line_holds(line, needle):
                    hit(line)
            # a pin's reason is an operator's text about its iteration: erasing the iteration
            # in place deletes its pins (before 2026-11-29 no erasure but the whole log's
            # found or removed a reason holding the text)
            pinned = [iteration for iteration, reason in session.execute(
                select(PinRow.iteration, PinRow.reason).where(
                    PinRow.fleet_id == fleet_id, PinRow.run_id == run_id))
                if holds(reason, needle)]
        for iteration in pinned:
            if iteration not in hits:
                try:
                    hit(self.iterations.summary(fleet_id, run_id, iteration).text())
                except NotFound:  # erased whole meanwhile
                    continue
        for key in self.blobs.list(run_prefix(fleet_id, run_id) + "/"):
            if INDEX_FILES in key:  # segment keys, sizes and hashes: nothing recorded
                continue
            try:
                lines, unparsed = blob_hits(key, self.blobs.open(key), needle)
            except NotFound:  # deleted since it was listed (an older index, a retired snapshot)
                continue
            whole = whole or unparsed
            for found in lines:
                if not found.erased:
                    hits.setdefault(found.iteration, found)
        return hits, whole

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
        purged = self.blobs.purge_prefix(prefix)  # noncurrent versions of deleted keys too
        self.iterations.drop_cached(prefix)
        with self.db.session() as session:
            session.execute(update(RunTombstoneRow).where(
                RunTombstoneRow.fleet_id == fleet_id, RunTombstoneRow.run_id == run_id)
                .values(blobs_left=False))
        return purged
