"""RecordEraser: the shard's part of ``engram forget`` (docs/erasure.md).

Selecting changes nothing: it lists the records a selector matches (and the compaction
summaries that quote them) with the leaf hashes their tombstones will keep. Erasing takes
an erasure id, reads that erasure from governance (the only writer of governance state
chains it first) and erases exactly the records it lists, in one transaction: the row
becomes a tombstone (structural fields and leaf hash, no content, tags, metadata, salt or
content hash); its tags, links, stored vector, write key, request claims and compaction rows
go; the full-text index drops its terms. Then the freed space is purged (SQLite: zeroed
pages, FTS5 merged, WAL truncated; Postgres: VACUUM) and the fleet's search index is rebuilt
and saved. Erasing the same erasure again erases nothing more.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import delete, insert, or_, select, text
from sqlalchemy.orm import Session

from services.common.erasure_source import (
    ErasureOrder,
    ErasureSource,
    PurgeThrottle,
    TextScans,
    recorded_erasure,
    selection_limit,
    still_wanted,
)
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.text_match import holds, needle_of
from services.common.tokens import Principal, validate_identifier
from services.shard.domain.records import Record, tombstone_of
from services.shard.repository import RecordFilter
from services.shard.service import ShardService
from services.shard.tables import (
    RECORD_VECTORS,
    RECORDS,
    CompactionRow,
    TombstoneRow,
    WriteKeyRow,
    WriteRequestRow,
    tombstone_values,
)

log = logging.getLogger("engram.shard.erasure")

SELECTORS = ("agent", "record", "run", "match")
PURGED_TABLES = ("records", "record_tags", "links", "record_vectors", "write_keys",
                 "write_requests", "compactions")


@dataclass(frozen=True)
class Forgotten:
    record_id: str
    record_hash: str
    kind: str  # "record" or "summary"
    format: int = 2
    """1: written before format 2; its tombstone keeps an id derived from its content."""


@dataclass(frozen=True)
class Selection:
    items: list[Forgotten]
    following: int | None = None
    """When more records match than were listed: the write sequence of the last record
    listed; the next page of the selection starts past it."""

    @property
    def more(self) -> bool:
        return self.following is not None


@dataclass(frozen=True)
class Erased:
    items: list[Forgotten]
    already: int


class RecordEraser:
    def __init__(self, service: ShardService, source: ErasureSource | None) -> None:
        self.service = service
        self.source = source
        self._purge_throttle = PurgeThrottle()
        self._scans = TextScans()

    # -- selecting ----------------------------------------------------------

    def select(self, fleet_id: str, kind: str, value: str, limit: int,
               active: Callable[[], bool] = lambda: True, after: int = 0) -> Selection:
        """What one selector names (and the summaries quoting it), from the records written
        after sequence ``after`` (a later page). A match reads the whole fleet: one scan slot
        of a few, and it stops when ``active`` says the caller has gone."""
        if kind != "match":
            return self._select(fleet_id, kind, value, limit, active, after)
        needle_of(value)
        with self._scans.slot("ForgetRecords by match"):
            return self._select(fleet_id, kind, value, limit, active, after)

    def _select(self, fleet_id: str, kind: str, value: str, limit: int,
                active: Callable[[], bool], after: int) -> Selection:
        if kind not in SELECTORS:
            raise InvalidArgument("name what to forget: agent_id, record_id, run_id or match",
                                  reason="SELECTOR_REQUIRED")
        if kind == "match":
            needle_of(value)
        else:
            validate_identifier(kind, value)
        limit = selection_limit(limit)
        repo = self.service.repo
        picked: list[Forgotten] = []
        seqs: list[int] = []
        more = False
        with self.service.db.session() as session:
            for seq, record in self._matching(session, fleet_id, kind, value, active, after):
                if len(picked) >= limit:
                    more = True
                    break
                picked.append(Forgotten(record.id, record.record_hash, "record", record.format))
                seqs.append(seq)
            ids = [p.record_id for p in picked]
            summaries = self._summaries_quoting(session, ids) - set(ids)
            # The summaries count against the limit too (governance takes at most that many
            # items an erasure): fewer records this round, the rest in the next.
            while len(picked) > 1 and len(picked) + len(summaries) > limit:
                del picked[max(1, min(len(picked) - 1, limit - len(summaries))):]
                more = True
                ids = [p.record_id for p in picked]
                summaries = self._summaries_quoting(session, ids) - set(ids)
            found = repo.by_ids(session, fleet_id, sorted(summaries))
        following = seqs[len(picked) - 1] if more else None  # picked holds one at least
        picked += [Forgotten(s.id, s.record_hash, "summary", s.format)
                   for s in sorted(found.values(), key=lambda r: r.id)]
        return Selection(picked, following)

    def _matching(self, session: Session, fleet_id: str, kind: str, value: str,
                  active: Callable[[], bool], after: int) -> Iterator[tuple[int, Record]]:
        """(write sequence, record) of each record the selector names past ``after``."""
        repo = self.service.repo
        if kind == "record":
            found = repo.get(session, fleet_id, value)
            if found is not None and not after:
                yield 0, found
            return
        if kind == "agent":
            yield from repo.scan_numbered(session, RecordFilter(fleet_id, agent_id=value), after)
            return
        if kind == "run":
            yield from repo.scan_numbered(session, RecordFilter(fleet_id, run_id=value), after)
            return
        needle = needle_of(value)
        for scanned, (seq, record) in enumerate(
                repo.scan_numbered(session, RecordFilter(fleet_id), after)):
            if scanned % 500 == 0:
                still_wanted(active)
            fields = [record.content, *record.tags, *record.metadata.keys(),
                      *record.metadata.values()]
            if any(holds(f, needle) for f in fields):
                yield seq, record

    @staticmethod
    def _summaries_quoting(session: Session, ids: list[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            found.update(session.scalars(select(CompactionRow.summary_id).where(
                CompactionRow.original_id.in_(ids[start:start + 500]))))
        return found

    # -- erasing ------------------------------------------------------------

    def erase(self, principal: Principal, fleet_id: str, erasure_id: str) -> Erased:
        order = recorded_erasure(self.source, "shard", erasure_id, fleet_id)
        now_us = int(self.service.clock() * 1_000_000)
        began = time.monotonic()
        erased, already = self._tombstone(order, now_us)
        if erased:
            self._purge_throttle.owe()
        stored = time.monotonic()
        # Again for an erasure carried out before: a run interrupted after its transaction
        # (a crash, a busy WAL) finishes here; when all was done, this finds nothing to do.
        self._purge_throttle.purge(self._purge)
        purged = time.monotonic()
        index = self.service.search_engine.index
        if index is not None:
            index.forget(fleet_id, order.ids("record", "summary"))
        for item in erased:
            self.service.erased.add(item.kind)
        if erased:
            log.info("records erased", extra={
                "erasure_id": erasure_id, "fleet_id": fleet_id, "records": len(erased),
                "already": already, "by": principal.agent_id,
                "store_s": round(stored - began, 3), "purge_s": round(purged - stored, 3),
                "index_s": round(time.monotonic() - purged, 3)})
        return Erased(erased, already)

    def _tombstone(self, order: ErasureOrder,
                   now_us: int) -> tuple[list[Forgotten], int]:
        ids = order.ids("record", "summary")
        kinds = {item_id: kind for kind, item_id, _ in order.items}
        leaves = {item_id: leaf for _, item_id, leaf in order.items}
        repo = self.service.repo
        with self.service.db.writing() as session:  # the same erasure run twice waits its turn
            # Held (Postgres) until the commit: a compaction marking one of them waits, and
            # its summary is then found below; one that marked first is found below too. The
            # same erasure carried out at once by another call: this waits for it, then reads
            # its tombstones.
            repo.lock_records(session, ids)
            done = set(repo.erased_among(session, ids))
            stored = repo.by_ids(session, order.fleet_id, [i for i in ids if i not in done])
            for record_id, record in stored.items():
                if record.record_hash != leaves[record_id]:
                    raise FailedPrecondition(
                        f"record {record_id} has record_hash {record.record_hash[:16]}… but "
                        f"erasure {order.erasure_id} lists {leaves[record_id][:16]}…; verify "
                        "the records (engram verify) before erasing", reason="ERASURE_MISMATCH",
                        metadata={"record_id": record_id})
            seqs = self._seqs(session, list(stored))
            if stored:
                session.execute(insert(TombstoneRow), [
                    tombstone_values(tombstone_of(r, order.erasure_id, now_us,
                                                  order.requested_by), seqs[r.id])
                    for r in stored.values()])
                # After a write (SQLite's write lock held): what quotes them now is current.
                self._refuse_unlisted_summaries(session, order, list(stored), set(ids) | done)
                self._drop_derived(session, order.fleet_id, list(stored.values()))
                repo.remove(session, order.fleet_id, list(stored))
        erased = [Forgotten(i, leaves[i], kinds[i], stored[i].format)
                  for i in ids if i in stored]
        return erased, len(done)

    def _refuse_unlisted_summaries(self, session: Session, order: ErasureOrder,
                                   erasing: list[str], listed: set[str]) -> None:
        """A compaction summary written since the selection quotes a record being erased and
        is not in the erasure: erasing the record alone would leave its text in the summary."""
        quoting = sorted(self._summaries_quoting(session, erasing) - listed)
        unlisted = sorted(self.service.repo.by_ids(session, order.fleet_id, quoting))
        if unlisted:
            raise FailedPrecondition(
                f"compaction summaries written since erasure {order.erasure_id} was recorded "
                f"quote records it erases ({', '.join(unlisted[:5])}); nothing was erased: run "
                "the forget again (its selection includes them)", reason="ERASURE_INCOMPLETE",
                metadata={"summary_ids": ",".join(unlisted[:20])})

    @staticmethod
    def _seqs(session: Session, ids: list[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for start in range(0, len(ids), 500):
            found.update((row.id, int(row.seq)) for row in session.execute(
                select(RECORDS.c.id, RECORDS.c.seq).where(
                    RECORDS.c.id.in_(ids[start:start + 500]))))
        return found

    @staticmethod
    def _drop_derived(session: Session, fleet_id: str, records: list[Record]) -> None:
        """Everything kept beside the records that derives from their content."""
        ids = [r.id for r in records]
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            session.execute(delete(RECORD_VECTORS).where(RECORD_VECTORS.c.record_id.in_(part)))
            session.execute(delete(WriteKeyRow).where(
                WriteKeyRow.fleet_id.concat("") == fleet_id,  # by record id, not the fleet
                WriteKeyRow.record_id.in_(part)))
            session.execute(delete(CompactionRow).where(or_(
                CompactionRow.original_id.in_(part), CompactionRow.summary_id.in_(part))))
        # A request claim keeps a digest of the request's body: it goes with any record it
        # named (a retry of that request then writes anew, through the gate). Claims are the
        # authors' own: one read of each author's claims, not one scan per record.
        erased = set(ids)
        for agent_id in sorted({r.agent_id for r in records}):
            claims = session.execute(select(
                WriteRequestRow.request_id, WriteRequestRow.record_ids_json).where(
                WriteRequestRow.fleet_id == fleet_id, WriteRequestRow.agent_id == agent_id))
            named = [request_id for request_id, listed in claims
                     if erased.intersection(_ids_of(listed))]
            for start in range(0, len(named), 500):
                session.execute(delete(WriteRequestRow).where(
                    WriteRequestRow.fleet_id == fleet_id, WriteRequestRow.agent_id == agent_id,
                    WriteRequestRow.request_id.in_(named[start:start + 500])))

    def _purge(self) -> None:
        db = self.service.db
        if db.dialect == "sqlite":
            with db.session() as session:  # merge FTS5 segments: no old one keeps the terms
                session.execute(text("INSERT INTO records_fts(records_fts) VALUES ('optimize')"))
        db.vacuum(PURGED_TABLES)


def _ids_of(listed: str) -> list[str]:
    """The record ids a request claim lists (an unreadable list names none)."""
    try:
        found = json.loads(listed)
    except ValueError:
        return []
    return [str(i) for i in found] if isinstance(found, list) else []
