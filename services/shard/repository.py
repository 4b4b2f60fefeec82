"""ShardRepository: the shard store on SQLite (FTS5) or Postgres (tsvector), same contract.

Every method takes an open session from :meth:`Database.session`, so one
transaction can span several calls (a write batch is all or nothing).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import (
    and_,
    bindparam,
    cast,
    column,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    table,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Result
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter, TextClause

from services.common.errors import IntegrityError
from services.common.fleet_secrets import fleet_secret
from services.shard.domain.crossrefs import CrossRef
from services.shard.domain.domains import Domain
from services.shard.domain.records import Record, Tombstone
from services.shard.retrieval.text import query_terms
from services.shard.tables import (
    DOMAINS,
    LINKS,
    RECORD_COLUMNS,
    RECORD_TAGS,
    RECORD_VECTORS,
    RECORDS,
    WRITE_KEYS,
    CompactionRow,
    DomainRow,
    FleetSecretRow,
    LinkRow,
    RecordRow,
    RecordTagRow,
    TombstoneRow,
    WriteRequestRow,
    columns_to_record,
    record_values,
    row_to_domain,
    row_to_record,
)


@dataclass(frozen=True)
class RecordFilter:
    fleet_id: str
    run_id: str | None = None
    domain: str = ""
    agent_id: str = ""
    tags: tuple[str, ...] = ()
    """A record must carry all of these."""
    exclude_compacted: bool = False
    tags_any: tuple[str, ...] = ()
    """A record must carry at least one of these."""
    metadata: tuple[tuple[str, str], ...] = ()
    """Key = value pairs a record must all carry."""
    created_after_us: int | None = None
    """Exclusive."""
    created_before_us: int | None = None
    """Exclusive."""
    min_importance: float | None = None

    def matches(self, record: Record) -> bool:
        """The same conditions as the SQL and the search index, on one loaded record."""
        if record.fleet_id != self.fleet_id:
            return False
        if self.run_id is not None and record.run_id != self.run_id:
            return False
        if self.domain and record.domain != self.domain:
            return False
        if self.agent_id and record.agent_id != self.agent_id:
            return False
        if not all(tag in record.tags for tag in self.tags):
            return False
        if self.tags_any and not any(tag in record.tags for tag in self.tags_any):
            return False
        if any(record.metadata.get(k) != v for k, v in self.metadata):
            return False
        if self.created_after_us is not None and record.created_us <= self.created_after_us:
            return False
        if self.created_before_us is not None and record.created_us >= self.created_before_us:
            return False
        return self.min_importance is None or record.importance >= self.min_importance


TAG_DRIVEN_MAX = 1000
"""A listing filtered by a tag at most this many of the fleet's records carry (fewer, for a
filter of many conditions: see :func:`_rare_enough`) looks only at those records."""
PAGE_EXAMINE_BUDGET = 10_000
"""Checks (a candidate row, a tag probe, a metadata value) one page of a listing makes at
most, beyond those of a rare tag's records (~8 ms on SQLite, 31 tag probes a row)."""


class RecordPage(NamedTuple):
    rows: list[tuple[int, Record]]
    """Newest first, at most the limit asked."""
    resume_before: int | None
    """Set when the rows examined ran out before the page filled: more matching records may
    be below this seq (the next page's ``before_seq``); None: there are none, or the page
    is full (its last row's seq continues)."""


class RecordText(NamedTuple):
    """A committed record as the search index reads it: its text and where it belongs."""

    seq: int
    id: str
    fleet_id: str
    run_id: str
    content: str
    metadata: dict[str, str]
    created_us: int
    agent_id: str = ""
    tags: tuple[str, ...] = ()
    importance: float = 0.5
    domain: str = ""


class StoredVector(NamedTuple):
    record_id: str
    fleet_id: str
    record_seq: int
    vector: bytes
    """float32, little-endian."""


# Built once: the write path runs these on every group commit, and a statement object
# compiles and computes its cache key once (building one per call cost ~0.3 ms each).
_IDS: BindParameter[list[str]] = bindparam("ids", expanding=True)
_EXISTING = select(RECORDS).where(RECORDS.c.id.in_(_IDS))
# Search's lookup (on every query): the same, without originals a compaction summary covers.
_LIVE_BY_IDS = _EXISTING.where(
    RECORDS.c.id.not_in(
        select(CompactionRow.original_id).where(CompactionRow.original_id.in_(_IDS))
    )
)
_INSERT_RECORDS = insert(RECORDS)
_WRITE_REQUESTS = WriteRequestRow.__table__
_FIND_REQUEST = select(_WRITE_REQUESTS.c.digest, _WRITE_REQUESTS.c.record_ids_json).where(
    _WRITE_REQUESTS.c.fleet_id == bindparam("fleet"),
    _WRITE_REQUESTS.c.agent_id == bindparam("agent"),
    _WRITE_REQUESTS.c.request_id == bindparam("request"))
_WRITE_KEYS = WRITE_KEYS
_IDS_FOR_KEYS = select(_WRITE_KEYS.c.key, _WRITE_KEYS.c.record_id).where(
    _WRITE_KEYS.c.fleet_id == bindparam("fleet"),
    _WRITE_KEYS.c.key.in_(bindparam("keys", expanding=True)))
# Claims (write keys, request ids) go as one multi-row INSERT ... ON CONFLICT DO NOTHING
# RETURNING, in the syntax SQLite (3.35+) and Postgres share, as text compiled once per row
# count: the ORM's and the dialects' ON CONFLICT inserts are never cached (compiled on every
# call: 2.7 ms of a 9 ms write, cProfile, in process; ~2 ms for a group's claims). A claim made
# concurrently (same group, or another replica) is no error: RETURNING names the rows stored,
# and a row whose key was taken first (by a concurrent write, or an earlier row of the same
# statement, VALUES being inserted in order) is not stored and not named.
_CLAIM_ROWS = 300
"""Rows per claim statement (SQLite allows 32,766 parameters in one)."""


def _fleet_and_key(triple: tuple[str, str, str]) -> tuple[str, str]:
    return triple[0], triple[2]


def _request_key(claim: RequestClaim) -> tuple[str, str, str]:
    return claim.fleet_id, claim.agent_id, claim.request_id


# One statement per table and row count: two tables of up to _CLAIM_ROWS shapes each.
@functools.lru_cache(maxsize=2 * _CLAIM_ROWS)
def _claim_statement(table: str, columns: tuple[str, ...], rows: int,
                     returning: str) -> TextClause:
    names = ", ".join(f'"{c}"' for c in columns)
    values = ", ".join("(" + ", ".join(f":{c}_{i}" for c in columns) + ")" for i in range(rows))
    return text(f"INSERT INTO {table} ({names}) VALUES {values} "
                f"ON CONFLICT DO NOTHING RETURNING {returning}")


def _claim(session: Session, table: str, rows: Sequence[dict[str, Any]],
           returning: str) -> list[Any]:
    """Insert ``rows`` (all with the same keys) unless their key is taken; the rows stored.

    Callers sort ``rows`` by the unique key (a stable sort: of two rows with one key, the
    first still wins). Postgres inserts a statement's rows in order and a row whose key an
    uncommitted transaction holds waits for it: two replicas claiming overlapping keys in
    different orders would each hold one the other waits for (a deadlock, 40P01); in one order
    the second waits before it takes any."""
    stored: list[Any] = []
    for start in range(0, len(rows), _CLAIM_ROWS):
        chunk = rows[start:start + _CLAIM_ROWS]
        columns = tuple(chunk[0])
        params = {f"{c}_{i}": row[c] for i, row in enumerate(chunk) for c in columns}
        statement = _claim_statement(table, columns, len(chunk), returning)
        stored += session.connection().execute(statement, params).all()
    return stored


_TOMBSTONES = TombstoneRow.__table__
_ERASED_AMONG = select(_TOMBSTONES.c.id, _TOMBSTONES.c.erasure_id).where(
    _TOMBSTONES.c.id.in_(_IDS))
# SQLite only: the highest seq held and the highest erased (see ShardRepository.insert).
_TOP_SEQS = select(select(func.max(RECORDS.c.seq)).scalar_subquery(),
                   select(func.max(_TOMBSTONES.c.seq)).scalar_subquery())
_INSERT_TAGS = insert(RECORD_TAGS)
_INSERT_LINKS = insert(LINKS)
_DOMAINS_OF = (
    select(DOMAINS).where(DOMAINS.c.fleet_id == bindparam("fleet")).order_by(DOMAINS.c.name)
)
_RECORD_TEXTS = select(
    RECORDS.c.seq,
    RECORDS.c.id,
    RECORDS.c.fleet_id,
    RECORDS.c.run_id,
    RECORDS.c.content,
    RECORDS.c.metadata_json,
    RECORDS.c.created_us,
    RECORDS.c.agent_id,
    RECORDS.c.tags_json,
    RECORDS.c.importance,
    RECORDS.c.domain,
)
_AFTER = RECORDS.c.seq > bindparam("position")
# The search index's catch-up runs before every search and every write's duplicate check.
_TEXTS_AFTER = _RECORD_TEXTS.where(_AFTER).order_by(RECORDS.c.seq).limit(bindparam("limit"))
_TEXTS_AFTER_AND_GAPS = (
    _RECORD_TEXTS.where(or_(_AFTER, RECORDS.c.seq.in_(bindparam("gaps", expanding=True))))
    .order_by(RECORDS.c.seq)
    .limit(bindparam("limit"))
)
_RECORD_USAGE = (
    update(DOMAINS)
    .where(DOMAINS.c.fleet_id == bindparam("k_fleet"), DOMAINS.c.name == bindparam("k_name"))
    .values(
        usage_score=bindparam("usage_score"),
        usage_ts=bindparam("usage_ts"),
        record_count=bindparam("record_count"),
        updated_ts=bindparam("updated_ts"),
    )
)


class RequestClaim(NamedTuple):
    """A write's request_id, claimed with the digest of its request and the ids it wrote."""

    fleet_id: str
    agent_id: str
    request_id: str
    digest: str
    record_ids: Sequence[str]


def _dicts(result: Result[Any]) -> Iterator[dict[str, Any]]:
    """``result``'s rows as plain dicts. ``Result.mappings()`` resolves every key through
    SQLAlchemy's row machinery: 40 records read by id took 1.40 ms that way and 0.84 ms as
    dicts (in process, SQLite, AVX2 EPYC); search reads 40 on every query."""
    keys = list(result.keys())
    for row in result:
        yield dict(zip(keys, row, strict=True))


_LIVE_CHUNK = 500
"""Ids a statement of :meth:`ShardRepository.live_by_ids` carries (each twice): under
SQLite's 32,766 host parameters, one text per count up to it."""


@functools.lru_cache(maxsize=2 * _LIVE_CHUNK)
def _live_sql(dialect: str, count: int) -> str:
    """The records among ``count`` ids that no compaction summary covers (``_LIVE_BY_IDS`` as
    text in the driver's placeholders: ``?`` for sqlite3, ``%s`` for psycopg)."""
    marks = ", ".join(["?" if dialect == "sqlite" else "%s"] * count)
    return (f"SELECT {', '.join(RECORD_COLUMNS)} FROM records WHERE id IN ({marks}) "
            f"AND id NOT IN (SELECT original_id FROM compactions WHERE original_id IN ({marks}))")


class ShardRepository:
    def __init__(self, dialect: str) -> None:
        self.dialect = dialect

    # -- writes -------------------------------------------------------------

    def existing(self, session: Session, ids: Iterable[str]) -> dict[str, Record]:
        wanted = list(set(ids))
        found: dict[str, Record] = {}
        for start in range(0, len(wanted), 500):
            rows = _dicts(session.execute(_EXISTING, {"ids": wanted[start : start + 500]}))
            found.update((row["id"], row_to_record(row)) for row in rows)
        return found

    def insert(self, session: Session, records: Sequence[Record]) -> None:
        if not records:
            return
        values = [record_values(r) for r in records]
        if self.dialect == "sqlite":
            # SQLite gives a new row the highest rowid + 1: after the newest records were
            # erased it would hand out their seqs again, which the search index's cursor has
            # passed (the record would never be indexed). Seqs continue past the erased ones.
            # (Postgres's sequence never goes back.) Called with the write lock held.
            top, erased = session.execute(_TOP_SEQS).one()
            top, erased = top or 0, erased or 0
            if erased > top:
                for offset, row in enumerate(values, start=1):
                    row["seq"] = erased + offset
        session.execute(_INSERT_RECORDS, values)
        tags = [
            {"record_id": r.id, "tag": tag, "fleet_id": r.fleet_id}
            for r in records
            for tag in r.tags
        ]
        if tags:
            session.execute(_INSERT_TAGS, tags)
        links = [
            {
                "source_id": r.id,
                "target_kind": ref.kind,
                "target": ref.target,
                "fleet_id": r.fleet_id,
            }
            for r in records
            for ref in map(CrossRef.parse, r.cross_refs)
        ]
        if links:
            session.execute(_INSERT_LINKS, links)

    def record_usage(self, session: Session, fleet_id: str, domains: Sequence[Domain]) -> None:
        if not domains:
            return
        session.execute(
            _RECORD_USAGE,
            [
                {
                    "k_fleet": fleet_id,
                    "k_name": domain.name,
                    "usage_score": domain.usage_score,
                    "usage_ts": domain.usage_ts,
                    "record_count": domain.record_count,
                    "updated_ts": domain.updated_ts,
                }
                for domain in domains
            ],
        )

    # -- idempotency keys ---------------------------------------------------

    def fleet_secret(self, session: Session, fleet_id: str) -> bytes:
        """The fleet's write-key secret, made on first use (a racing maker's wins)."""
        return fleet_secret(session, FleetSecretRow, fleet_id)

    def holds_format_1(self, session: Session, fleet_id: str) -> bool:
        """Whether the fleet holds a record written before format 2 (ids derived)."""
        return session.scalar(select(RECORDS.c.seq).where(
            RECORDS.c.fleet_id == fleet_id, RECORDS.c.format == 1).limit(1)) is not None

    def ids_for_keys(self, session: Session, fleet_id: str, keys: Sequence[str]) -> dict[str, str]:
        """Write key -> the record id it landed on, for those of ``keys`` stored."""
        wanted = sorted(set(keys))
        found: dict[str, str] = {}
        for start in range(0, len(wanted), 500):
            rows = session.connection().execute(
                _IDS_FOR_KEYS, {"fleet": fleet_id, "keys": wanted[start:start + 500]})
            found.update((row.key, row.record_id) for row in rows)
        return found

    def claim_write_keys(self, session: Session,
                         triples: Sequence[tuple[str, str, str]]) -> dict[str, str]:
        """Store each ``(fleet, record id, key)`` in one statement; returns record id -> the id
        stored first under its key, for the records whose key was taken (they are not
        stored: a concurrent or earlier write of the same text landed first)."""
        if not triples:
            return {}
        rows = [{"fleet_id": fleet, "key": key, "record_id": record_id}
                for fleet, record_id, key in sorted(triples, key=_fleet_and_key)]
        claimed = {row.record_id for row in _claim(session, "write_keys", rows, "record_id")}
        lost: dict[str, str] = {}
        for fleet, record_id, key in triples:
            if record_id not in claimed:
                lost[record_id] = self.ids_for_keys(session, fleet, [key])[key]
        return lost

    def find_request(
        self, session: Session, fleet_id: str, agent_id: str, request_id: str
    ) -> tuple[str, list[str]] | None:
        row = session.connection().execute(_FIND_REQUEST, {
            "fleet": fleet_id, "agent": agent_id, "request": request_id}).first()
        if row is None:
            return None
        return row.digest, list(json.loads(row.record_ids_json))

    def claim_requests(self, session: Session, claims: Sequence[RequestClaim],
                       now_us: int) -> dict[tuple[str, str, str], str]:
        """Record each claim's request_id, the group's in one statement; returns
        ``(fleet, agent, request_id) -> the digest stored first`` for the request ids that
        were taken (by an earlier write, or an earlier claim of the same group).

        On Postgres a claim racing an uncommitted one waits for it, then reads what it stored.
        """
        if not claims:
            return {}
        rows = [{"fleet_id": c.fleet_id, "agent_id": c.agent_id, "request_id": c.request_id,
                 "digest": c.digest, "record_ids_json": json.dumps(list(c.record_ids)),
                 "created_us": now_us} for c in sorted(claims, key=_request_key)]
        stored = {(r.fleet_id, r.agent_id, r.request_id) for r in _claim(
            session, "write_requests", rows, "fleet_id, agent_id, request_id")}
        taken: dict[tuple[str, str, str], str] = {}
        for claim in claims:
            key = (claim.fleet_id, claim.agent_id, claim.request_id)
            if key in stored:
                stored.discard(key)  # a second claim of the same key in this group lost
                continue
            found = self.find_request(session, *key)
            assert found is not None, "a conflicting request row must be visible after the wait"
            taken[key] = found[0]
        return taken

    # -- domains ------------------------------------------------------------

    def domains(self, session: Session, fleet_id: str) -> list[Domain]:
        rows = _dicts(session.execute(_DOMAINS_OF, {"fleet": fleet_id}))
        return [row_to_domain(row) for row in rows]

    def add_domains(self, session: Session, fleet_id: str, domains: Sequence[Domain]) -> None:
        session.execute(
            insert(DomainRow),
            [
                {
                    "fleet_id": fleet_id,
                    "name": d.name,
                    "display_name": d.display_name,
                    "description": d.description,
                    "keywords_json": json.dumps(list(d.keywords)),
                    "usage_score": d.usage_score,
                    "usage_ts": d.usage_ts,
                    "record_count": d.record_count,
                    "updated_ts": d.updated_ts,
                }
                for d in domains
            ],
        )

    def update_domain(self, session: Session, fleet_id: str, domain: Domain) -> None:
        session.execute(
            update(DomainRow)
            .where(DomainRow.fleet_id == fleet_id, DomainRow.name == domain.name)
            .values(
                display_name=domain.display_name,
                description=domain.description,
                keywords_json=json.dumps(list(domain.keywords)),
                updated_ts=domain.updated_ts,
            )
        )

    def incoming_domain_links(self, session: Session, fleet_id: str) -> dict[str, int]:
        rows = session.execute(
            select(LinkRow.target, func.count())
            .where(LinkRow.fleet_id == fleet_id, LinkRow.target_kind == "domain")
            .group_by(LinkRow.target)
        ).tuples()
        return {target: int(count) for target, count in rows}

    # -- reads --------------------------------------------------------------

    def get(self, session: Session, fleet_id: str, record_id: str) -> Record | None:
        row = session.scalar(
            select(RecordRow).where(RecordRow.id == record_id, RecordRow.fleet_id == fleet_id)
        )
        return row.to_entity() if row else None

    def tombstone(self, session: Session, fleet_id: str, record_id: str) -> Tombstone | None:
        row = session.get(TombstoneRow, record_id)
        return row.to_entity() if row is not None and row.fleet_id == fleet_id else None

    def erased_among(self, session: Session, ids: Sequence[str]) -> dict[str, str]:
        """Those of ``ids`` erased (any fleet: an id is never reused) -> their erasure."""
        found: dict[str, str] = {}
        for start in range(0, len(ids), 500):
            rows = session.execute(_ERASED_AMONG, {"ids": list(ids[start:start + 500])})
            found.update((record_id, erasure_id) for record_id, erasure_id in rows)
        return found

    def tombstone_count(self, session: Session) -> int:
        return int(session.scalar(select(func.count()).select_from(TombstoneRow)) or 0)

    def tombstone_ids_by_fleet(self, session: Session) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for fleet_id, record_id in session.execute(
                select(TombstoneRow.fleet_id, TombstoneRow.id)):
            found.setdefault(fleet_id, []).append(record_id)
        return found

    def by_ids(self, session: Session, fleet_id: str, ids: Sequence[str], *,
               exclude_compacted: bool = False) -> dict[str, Record]:
        """The fleet's records among ``ids``; with ``exclude_compacted``, without the originals
        a compaction summary covers (in the same statement: search asks this on every query)."""
        if not ids:
            return {}
        # Look up by the unique id index alone, then keep the fleet's: with both in the WHERE
        # clause SQLite's planner may scan the whole fleet instead.
        statement = _LIVE_BY_IDS if exclude_compacted else _EXISTING
        # Core rows through the session's connection, skipping the ORM's result machinery
        # (asked on every search: 40 ids at 10k records, 1.09 -> 1.02 ms p50 in process).
        rows = _dicts(session.connection().execute(statement, {"ids": list(ids)}))
        return {row["id"]: row_to_record(row) for row in rows if row["fleet_id"] == fleet_id}

    def live_by_ids(self, session: Session | Connection, fleet_id: str,
                    ids: Sequence[str]) -> dict[str, Record]:
        """:meth:`by_ids` with ``exclude_compacted``, for search (asked on every query, 40 ids
        or more): one SQL text per number of ids in the driver's placeholders, its rows read by
        position, past SQLAlchemy's compilation of expanding parameters and its mappings (40
        records of 10k: 0.84 -> 0.6 ms in process, SQLite, AVX2 EPYC). Same rows, same
        records."""
        if not ids:
            return {}
        ids = list(dict.fromkeys(ids))
        found: dict[str, Record] = {}
        connection = session.connection() if isinstance(session, Session) else session
        for start in range(0, len(ids), _LIVE_CHUNK):
            part = ids[start:start + _LIVE_CHUNK]
            # exec_driver_sql: no compilation, but SQLAlchemy's error handling (a dropped
            # connection is still UNAVAILABLE, a full disk STORAGE_FULL, the link invalidated)
            rows = connection.exec_driver_sql(_live_sql(self.dialect, len(part)),
                                              (*part, *part))
            for row in rows:
                if row[1] == fleet_id:
                    found[row[0]] = columns_to_record(row)
        return found

    def _filtered(self, flt: RecordFilter, *, fleet_by_index: bool = True):  # type: ignore[no-untyped-def]
        """``flt`` as one WHERE clause. The tag (and compaction) conditions are correlated
        subqueries: probes of ``record_tags``' primary key on each row examined. (An ``IN
        (subquery)`` per tag had SQLite build a list of every record of the fleet carrying
        that tag, on every call: 31 common tags, 2 s at 50k records; on Postgres 31 semi-joins
        took 2 s to plan.) ``fleet_by_index=False``: the fleet is checked on each row, not
        searched by (see :func:`_not_by_index`)."""
        fleet = RecordRow.fleet_id if fleet_by_index else _not_by_index(RecordRow.fleet_id)
        clauses = [fleet == flt.fleet_id]
        if flt.run_id is not None:
            clauses.append(RecordRow.run_id == flt.run_id)
        if flt.domain:
            clauses.append(RecordRow.domain == flt.domain)
        if flt.agent_id:
            clauses.append(RecordRow.agent_id == flt.agent_id)
        if flt.tags:
            clauses.append(_carried(flt.tags))
        if flt.tags_any:
            clauses.append(_carries(RecordTagRow.tag.in_(list(flt.tags_any))))
        for key, value in flt.metadata:
            clauses.append(self._metadata_value(key) == value)
        if flt.created_after_us is not None:
            clauses.append(RecordRow.created_us > flt.created_after_us)
        if flt.created_before_us is not None:
            clauses.append(RecordRow.created_us < flt.created_before_us)
        if flt.min_importance is not None:
            clauses.append(RecordRow.importance >= flt.min_importance)
        if flt.exclude_compacted:
            clauses.append(~select(CompactionRow.original_id).where(
                CompactionRow.original_id == RecordRow.id).exists())
        return and_(*clauses)

    def _metadata_value(self, key: str):  # type: ignore[no-untyped-def]
        """The text of one metadata key (a bound parameter on Postgres; on SQLite a JSON path
        whose key the edge has checked holds no quote or backslash)."""
        if self.dialect == "postgresql":
            return func.jsonb_extract_path_text(cast(RecordRow.metadata_json, JSONB),
                                                bindparam(None, key, unique=True))
        return func.json_extract(RecordRow.metadata_json,
                                 bindparam(None, f'$."{key}"', unique=True))

    def page(
        self, session: Session, flt: RecordFilter, before_seq: int | None, limit: int
    ) -> RecordPage:
        """Newest first; ``before_seq`` continues after the previous page.

        The rows examined are bounded, whatever the filter (an agent's ListRecords of 31 tags
        every record carries and a metadata pair none has walked the whole fleet testing each
        row: ~2 s at 50k records). When a tag of the filter is carried by few records
        (:func:`_rare_enough`), those records are the candidates (the page is exact).
        Otherwise the candidates are the next window of the fleet (of its run, or domain, when
        the filter names one) newest first, as many as :func:`_window_rows` allows: a page
        may then hold fewer than ``limit`` rows, even none, with ``resume_before`` set: the
        listing goes on below that seq (the rows from one page to the next are exactly those
        an unbounded query gives, in the same order)."""
        before = RecordRow.seq < before_seq if before_seq is not None else None
        rarest = self._rare_tag(session, flt) if flt.tags else None
        if rarest is not None:
            return RecordPage(self._tag_driven(session, flt, rarest, before_seq, limit), None)
        query = select(RecordRow).where(self._filtered(flt))
        if before is not None:
            query = query.where(before)
        floor = None
        if _residual(flt):
            floor = self._window_floor(session, flt, before_seq, _window_rows(flt, limit))
            if floor is not None:
                query = query.where(RecordRow.seq >= floor)
        rows = [(row.seq, row.to_entity())
                for row in session.scalars(query.order_by(RecordRow.seq.desc()).limit(limit))]
        return RecordPage(rows, floor if floor is not None and len(rows) < limit else None)

    def _rare_tag(self, session: Session, flt: RecordFilter) -> str | None:
        """A tag of ``flt.tags`` the fewest of the fleet's records carry, if few enough do
        (:func:`_rare_enough`; each tag's count stops there: one statement reading at most
        that many index entries + 1 a tag). Ordered by the index's last column: without it
        Postgres, given statistics, counted a common tag by a sequential scan under the
        LIMIT (betting on the tag's rows coming early: 20k rows read for 31 counts of 21)."""
        most = _rare_enough(flt)
        counts = [
            select(func.count()).select_from(
                select(literal_column("1")).select_from(RECORD_TAGS).where(
                    RECORD_TAGS.c.fleet_id == flt.fleet_id, RECORD_TAGS.c.tag == tag)
                .order_by(RECORD_TAGS.c.record_id).limit(most + 1).subquery()).scalar_subquery()
            for tag in flt.tags]
        found = session.execute(select(*counts)).one()
        count, tag = min(zip(found, flt.tags, strict=True))
        return tag if count <= most else None

    def _tag_driven(self, session: Session, flt: RecordFilter, tag: str,
                    before_seq: int | None, limit: int) -> list[tuple[int, Record]]:
        """The page among the (few) records carrying ``tag``: their seqs
        that pass ``flt``, looked up by id; the newest ``limit`` loaded."""
        ids = list(session.scalars(select(RECORD_TAGS.c.record_id).where(
            RECORD_TAGS.c.fleet_id == flt.fleet_id, RECORD_TAGS.c.tag == tag)))
        seqs: list[int] = []
        for start in range(0, len(ids), 500):
            query = select(RecordRow.seq).where(RecordRow.id.in_(ids[start:start + 500]),
                                                self._filtered(flt, fleet_by_index=False))
            if before_seq is not None:
                query = query.where(RecordRow.seq < before_seq)
            seqs += session.scalars(query)
        wanted = sorted(seqs, reverse=True)[:limit]
        if not wanted:
            return []
        rows = session.scalars(select(RecordRow).where(RecordRow.seq.in_(wanted))
                               .order_by(RecordRow.seq.desc()))
        return [(row.seq, row.to_entity()) for row in rows]

    def _window_floor(self, session: Session, flt: RecordFilter, before_seq: int | None,
                      rows: int) -> int | None:
        """The lowest seq of the next ``rows`` candidates below ``before_seq`` (newest first,
        on the fleet's index, or its run's or domain's); None: no more than ``rows`` remain."""
        query = select(RecordRow.seq).where(RecordRow.fleet_id == flt.fleet_id)
        if flt.run_id is not None:
            query = query.where(RecordRow.run_id == flt.run_id)
        elif flt.domain:
            query = query.where(RecordRow.domain == flt.domain)
        if before_seq is not None:
            query = query.where(RecordRow.seq < before_seq)
        found = list(session.scalars(
            query.order_by(RecordRow.seq.desc()).offset(rows - 1).limit(2)))
        return int(found[0]) if len(found) == 2 else None

    def oldest_after(
        self, session: Session, flt: RecordFilter, after_seq: int, limit: int
    ) -> list[tuple[int, Record]]:
        """Oldest first, from just past ``after_seq`` (a keyset page)."""
        rows = session.scalars(
            select(RecordRow)
            .where(self._filtered(flt), RecordRow.seq > after_seq)
            .order_by(RecordRow.seq)
            .limit(limit)
        )
        return [(row.seq, row.to_entity()) for row in rows]

    def scan_checked(self, session: Session, flt: RecordFilter,
                     batch: int = 500) -> Iterator[Record | IntegrityError]:
        """As :meth:`scan`, but a row that no longer parses comes out as its DATA_LOSS error
        (naming the record) instead of ending the scan: a verify reports every bad row."""
        after = 0
        while True:
            rows = list(session.scalars(
                select(RecordRow).where(self._filtered(flt), RecordRow.seq > after)
                .order_by(RecordRow.seq).limit(batch)))
            if not rows:
                return
            for row in rows:
                yield _checked(row)
            after = rows[-1].seq

    def checked_after(self, session: Session, fleet_id: str, after_seq: int,
                      limit: int) -> list[tuple[int, Record | IntegrityError]]:
        """A page of the fleet's records after ``after_seq``, oldest first, each as
        :meth:`scan_checked` gives it (a paged verification)."""
        rows = session.scalars(select(RecordRow).where(
            RecordRow.fleet_id == fleet_id, RecordRow.seq > after_seq)
            .order_by(RecordRow.seq).limit(limit))
        return [(row.seq, _checked(row)) for row in rows]

    def tombstones_after(self, session: Session, fleet_id: str, after_seq: int,
                         limit: int) -> list[tuple[int, Tombstone]]:
        """A page of the fleet's erased records after ``after_seq``, in write order."""
        rows = session.scalars(select(TombstoneRow).where(
            TombstoneRow.fleet_id == fleet_id, TombstoneRow.seq > after_seq)
            .order_by(TombstoneRow.seq).limit(limit))
        return [(row.seq, row.to_entity()) for row in rows]

    def by_ids_checked(self, session: Session, fleet_id: str,
                       ids: Sequence[str]) -> dict[str, Record | IntegrityError]:
        """As :meth:`by_ids`, with an unreadable row as its DATA_LOSS error."""
        rows = _dicts(session.execute(_EXISTING, {"ids": list(ids)}))
        return {row["id"]: _checked(row) for row in rows if row["fleet_id"] == fleet_id}

    def scan(self, session: Session, flt: RecordFilter, batch: int = 500) -> Iterator[Record]:
        """Oldest first, in batches, without holding the whole set in memory."""
        for _seq, record in self.scan_numbered(session, flt, batch=batch):
            yield record

    def scan_numbered(self, session: Session, flt: RecordFilter, after: int = 0,
                      batch: int = 500) -> Iterator[tuple[int, Record]]:
        """(write sequence, record), oldest first from past ``after``, in batches."""
        while True:
            page = self.oldest_after(session, flt, after, batch)
            if not page:
                return
            yield from page
            after = page[-1][0]

    def lexical(
        self, session: Session, flt: RecordFilter, query: str, limit: int
    ) -> list[tuple[Record, float]]:
        """Full-text matches with a relevance > 0 (higher is better)."""
        terms = query_terms(query)
        if not terms:
            return []
        if self.dialect == "sqlite":
            match = " OR ".join(f'"{t}"' for t in terms)
            fts = table("records_fts", column("rowid"))
            relevance = (-func.bm25(literal_column("records_fts"))).label("relevance")
            stmt = (
                select(RecordRow, relevance)
                .join(fts, fts.c.rowid == RecordRow.seq)
                .where(text("records_fts MATCH :match"), self._filtered(flt))
                .order_by(relevance.desc())
                .limit(limit)
            )
            rows = session.execute(stmt, {"match": match})
        else:
            tsquery = func.to_tsquery("english", " | ".join(terms))
            rank = func.ts_rank_cd(text("records.content_tsv"), tsquery)
            stmt = (
                select(RecordRow, rank.label("relevance"))
                .where(
                    text("records.content_tsv @@ to_tsquery('english', :q)"), self._filtered(flt)
                )
                .order_by(rank.desc())
                .limit(limit)
            )
            rows = session.execute(stmt, {"q": " | ".join(terms)})
        return [(row[0].to_entity(), max(float(row[1]), 1e-9)) for row in rows]

    def links_from(self, session: Session, fleet_id: str, ids: Sequence[str]) -> list[CrossRef]:
        rows = session.execute(
            select(LinkRow.target_kind, LinkRow.target).where(
                _not_by_index(LinkRow.fleet_id) == fleet_id, LinkRow.source_id.in_(list(ids))
            )
        ).tuples()
        return [CrossRef(kind, target) for kind, target in rows]

    def linking_to(self, session: Session, fleet_id: str, ids: Sequence[str],
                   limit: int) -> list[str]:
        """At most ``limit`` records that reference any of ``ids`` (the reverse direction of
        a link): nothing bounds how many records may cite one record."""
        rows = session.scalars(
            select(LinkRow.source_id).where(
                LinkRow.fleet_id == fleet_id,
                LinkRow.target_kind == "record",
                LinkRow.target.in_(list(ids)),
            ).limit(limit)
        )
        return list(rows)

    # -- status -------------------------------------------------------------

    def counts(self, session: Session, fleet_id: str) -> tuple[int, int, int]:
        total = session.scalar(select(func.count()).where(RecordRow.fleet_id == fleet_id)) or 0
        runs = (
            session.scalar(
                select(func.count(func.distinct(RecordRow.run_id))).where(
                    RecordRow.fleet_id == fleet_id
                )
            )
            or 0
        )
        links = session.scalar(select(func.count()).where(LinkRow.fleet_id == fleet_id)) or 0
        return int(total), int(runs), int(links)

    # -- compaction ---------------------------------------------------------

    def compacted_ids(self, session: Session, fleet_id: str) -> set[str]:
        return set(
            session.scalars(
                select(CompactionRow.original_id).where(CompactionRow.fleet_id == fleet_id)
            )
        )

    def compacted_among(self, session: Session, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` a summary already covers."""
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            found.update(session.scalars(select(CompactionRow.original_id).where(
                CompactionRow.original_id.in_(ids[start:start + 500]))))
        return found

    def lock_records(self, session: Session, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` still stored, their rows held until the transaction ends (Postgres
        ``FOR UPDATE``; on SQLite the transaction's write lock serialises instead). A
        compaction marking its originals and an erasure deleting them meet here."""
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            found.update(session.scalars(select(RecordRow.id).where(
                RecordRow.id.in_(list(ids[start:start + 500]))).with_for_update()))
        return found

    def mark_compacted(
        self,
        session: Session,
        fleet_id: str,
        summary_id: str,
        originals: Sequence[Record],
        now_us: int,
    ) -> None:
        session.execute(
            insert(CompactionRow),
            [
                {
                    "original_id": r.id,
                    "summary_id": summary_id,
                    "fleet_id": fleet_id,
                    "original_hash": r.record_hash,
                    "created_us": now_us,
                }
                for r in originals
            ],
        )

    def covered_before(self, session: Session, fleet_id: str, created_before_us: int) -> list[str]:
        rows = session.scalars(
            select(RecordRow.id)
            .join(CompactionRow, CompactionRow.original_id == RecordRow.id)
            # Only the fleet's own summaries count: a compaction row naming another fleet's
            # record never makes it removable here.
            .where(RecordRow.fleet_id == fleet_id, CompactionRow.fleet_id == fleet_id,
                   RecordRow.created_us < created_before_us)
            .order_by(RecordRow.seq)
        )
        return list(rows)

    def remove(self, session: Session, fleet_id: str, ids: Sequence[str]) -> None:
        """Retention only: originals whose hashes a summary record keeps. What derives from
        their content goes with them: tags, links, stored vectors and write keys (a write of
        the same text again is then stored anew)."""
        for start in range(0, len(ids), 500):
            part = list(ids[start:start + 500])
            session.execute(delete(RecordTagRow).where(RecordTagRow.record_id.in_(part)))
            session.execute(delete(LinkRow).where(or_(
                LinkRow.source_id.in_(part),
                and_(LinkRow.target_kind == "record", LinkRow.target.in_(part)))))
            session.execute(delete(RECORD_VECTORS).where(RECORD_VECTORS.c.record_id.in_(part)))
            session.execute(delete(WRITE_KEYS).where(
                _not_by_index(WRITE_KEYS.c.fleet_id) == fleet_id,
                WRITE_KEYS.c.record_id.in_(part)))
            session.execute(delete(RecordRow).where(
                _not_by_index(RecordRow.fleet_id) == fleet_id, RecordRow.id.in_(part)))

    # -- the search index: catch-up and stored vectors ----------------------

    def texts_after(self, connection: Connection, position: int, gaps: Sequence[int],
                    limit: int) -> list[RecordText]:
        """Records past ``seq`` ``position``, and those among ``gaps``, oldest first (Core
        rows, through :meth:`Database.reading`: no ORM session or result machinery)."""
        params: dict[str, object] = {"position": position, "limit": limit}
        if gaps:
            rows = connection.execute(_TEXTS_AFTER_AND_GAPS, {**params, "gaps": list(gaps)})
        else:
            rows = connection.execute(_TEXTS_AFTER, params)
        return [_record_text(row) for row in rows]

    def fleet_texts(self, session: Session, fleet_id: str, after: int, through: int,
                    gaps: Sequence[int], limit: int) -> list[RecordText]:
        """One fleet's records with ``after < seq <= through``, not among ``gaps``, oldest
        first (an index rebuilt after an erasure)."""
        query = (_RECORD_TEXTS.where(RECORDS.c.fleet_id == fleet_id, RECORDS.c.seq > after,
                                     RECORDS.c.seq <= through)
                 .order_by(RECORDS.c.seq).limit(limit))
        if gaps:
            query = query.where(RECORDS.c.seq.not_in(list(gaps)))
        return [_record_text(row) for row in session.connection().execute(query)]

    def texts_by_ids(self, session: Session, ids: Sequence[str]) -> list[RecordText]:
        """Those of ``ids`` still stored, in seq order."""
        found: list[RecordText] = []
        for start in range(0, len(ids), 500):
            query = _RECORD_TEXTS.where(RECORDS.c.id.in_(list(ids[start:start + 500])))
            found += [_record_text(row) for row in session.connection().execute(query)]
        return sorted(found, key=lambda row: row.seq)

    def created_after(self, session: Session, position: int) -> int | None:
        """The creation time (µs) of the first record committed past ``seq`` ``position``."""
        value = session.scalar(select(RECORDS.c.created_us).where(RECORDS.c.seq > position)
                               .order_by(RECORDS.c.seq).limit(1))
        return int(value) if value is not None else None

    def count_after(self, session: Session, position: int, fleet_id: str | None = None) -> int:
        """Records committed past ``seq`` ``position`` (of ``fleet_id``, else all fleets)."""
        query = select(func.count()).select_from(RECORDS).where(RECORDS.c.seq > position)
        if fleet_id is not None:
            query = query.where(RECORDS.c.fleet_id == fleet_id)
        return int(session.scalar(query) or 0)

    def count_through(self, session: Session, position: int, gaps: Sequence[int],
                      fleet_id: str | None = None) -> int:
        """Records with ``seq <= position``, not counting those among ``gaps`` (of
        ``fleet_id``, else all fleets)."""
        query = select(func.count()).select_from(RECORDS).where(RECORDS.c.seq <= position)
        if gaps:
            query = query.where(RECORDS.c.seq.not_in(list(gaps)))
        if fleet_id is not None:
            query = query.where(RECORDS.c.fleet_id == fleet_id)
        return int(session.scalar(query) or 0)

    def id_at(self, session: Session, seq: int) -> str | None:
        """The id of the record at ``seq`` (None: no such record)."""
        found = session.scalar(select(RECORDS.c.id).where(RECORDS.c.seq == seq))
        return str(found) if found is not None else None

    def stored_vectors(self, session: Session, ids: Sequence[str], model: str) -> dict[str, bytes]:
        """Record id -> its stored vector from ``model``, for those of ``ids`` that have one."""
        rows = session.execute(
            select(RECORD_VECTORS.c.record_id, RECORD_VECTORS.c.vector).where(
                RECORD_VECTORS.c.record_id.in_(list(ids)), RECORD_VECTORS.c.model == model
            )
        ).tuples()
        return {record_id: vector for record_id, vector in rows}

    def vectors_of_model(self, session: Session, model: str, after_seq: int,
                         limit: int) -> list[Any]:
        """The next ``limit`` stored vectors of ``model`` past record seq ``after_seq``, in seq
        order (rows with ``record_id``, ``fleet_id``, ``record_seq``, ``vector``)."""
        return list(session.execute(
            select(RECORD_VECTORS.c.record_id, RECORD_VECTORS.c.fleet_id,
                   RECORD_VECTORS.c.record_seq, RECORD_VECTORS.c.vector)
            .where(RECORD_VECTORS.c.model == model, RECORD_VECTORS.c.record_seq > after_seq)
            .order_by(RECORD_VECTORS.c.record_seq).limit(limit)))

    def replace_vectors(self, session: Session, model: str,
                        vectors: Sequence[StoredVector]) -> None:
        """Store these records' vectors from ``model`` in place of any they had."""
        if not vectors:
            return
        session.execute(delete(RECORD_VECTORS).where(
            RECORD_VECTORS.c.record_id.in_([v.record_id for v in vectors])))
        session.execute(insert(RECORD_VECTORS), [
            {"record_id": v.record_id, "fleet_id": v.fleet_id, "record_seq": v.record_seq,
             "model": model, "vector": v.vector}
            for v in vectors
        ])


def _record_text(row: Any) -> RecordText:
    return RecordText(int(row.seq), row.id, row.fleet_id, row.run_id or "", row.content,
                      json.loads(row.metadata_json or "{}"), row.created_us, row.agent_id,
                      tuple(json.loads(row.tags_json or "[]")), float(row.importance),
                      row.domain or "")


def _checked(row: Any) -> Record | IntegrityError:
    """A records row (ORM or mapping) as a record, or the DATA_LOSS error it raises."""
    try:
        return row.to_entity() if isinstance(row, RecordRow) else row_to_record(row)
    except IntegrityError as failure:
        return failure


def _carried(tags: Sequence[str]) -> Any:
    """The record carries every one of ``tags``: a count of its tags among them, one
    correlated subquery on ``record_tags``' primary key. (An aggregate: Postgres keeps it a
    subplan, where one EXISTS a tag became one semi-join each, and planning 31 of them took
    longer than any execution.)"""
    wanted = sorted(set(tags))
    found = select(func.count()).select_from(RecordTagRow).where(
        RecordTagRow.record_id == RecordRow.id, RecordTagRow.tag.in_(wanted)).scalar_subquery()
    return found == len(wanted)


def _carries(tag_condition: Any) -> Any:
    """The record carries a tag meeting ``tag_condition`` (probed by its primary key)."""
    return select(RecordTagRow.record_id).where(
        RecordTagRow.record_id == RecordRow.id, tag_condition).exists()


def _residual(flt: RecordFilter) -> bool:
    """Whether ``flt`` holds a condition the candidates' index does not (the fleet's, or its
    run's or domain's, newest first): then a page may examine rows it does not return."""
    return bool(flt.agent_id or flt.tags or flt.tags_any or flt.metadata
                or flt.created_after_us is not None or flt.created_before_us is not None
                or flt.min_importance is not None or flt.exclude_compacted
                or (flt.run_id is not None and flt.domain))


def _window_rows(flt: RecordFilter, limit: int) -> int:
    """How many candidate rows one page examines: :data:`PAGE_EXAMINE_BUDGET` checks, a tag
    probe or a metadata value one each (never fewer rows than the page asks)."""
    checks = 1 + len(flt.tags) + len(flt.tags_any) + len(flt.metadata)
    return max(limit, PAGE_EXAMINE_BUDGET // checks)


def _rare_enough(flt: RecordFilter) -> int:
    """The most records a tag of ``flt.tags`` may be carried by to drive a page: within the
    page's budget (:func:`_window_rows`), and :data:`TAG_DRIVEN_MAX`."""
    return min(TAG_DRIVEN_MAX, _window_rows(flt, 1))


def _not_by_index(column: Any) -> Any:
    """``column`` in a form no index serves (``column || ''``), for a WHERE clause that also
    names rows by their unique id: given ``fleet_id = ? AND id IN (...)``, SQLite's planner
    walked the fleet's index (every row of the fleet) instead of looking each id up; with
    this it looks the ids up and checks the fleet on each row. Same result on Postgres."""
    return column.concat("")
