"""SearchEngine: lexical, semantic or hybrid retrieval, re-ranking, cross-reference expansion.

Every mode is served by the :class:`SearchIndex`: a per-fleet in-memory
:class:`FleetIndex` caught up from the records table before each search (lexical:
numpy BM25 over postings; semantic and hybrid add MiniLM vectors). The store's
full-text index (FTS5 bm25 on SQLite, ts_rank_cd on Postgres) serves the gate's
neighbour search and any engine built without an index. The FleetIndex applies
the craft measured on LoCoMo
(docs/retrieval.md): stemmed BM25 over a record plus its run neighbours, MiniLM
cosine blended with the neighbours', weighted-sum fusion, neighbour smoothing.
:func:`services.shard.domain.scoring.final_score`
multiplies it by importance, recency and the author's trust multiplier; a
record that names its sources' authors (a compaction summary's
``source_authors``) ranks with the lowest trust among its author and them.
Authors with multiplier 0.0 (suspended) never surface. Governance
unreachable -> each author's last known multiplier, 1.0 only for authors the
shard never saw (with a logged warning; see GovernanceTrust).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from services.common.db import Database
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.tokens import is_identifier
from services.shard.domain.compaction import SOURCE_AUTHORS_KEY
from services.shard.domain.crossrefs import CrossRef
from services.shard.domain.records import Record
from services.shard.domain.scoring import final_score
from services.shard.ports import Neighbour, TrustSource
from services.shard.repository import RecordFilter, ShardRepository
from services.shard.search.fleet_index import DocFilter
from services.shard.search.index import Duplicate, SearchIndex

MAX_LIMIT = 100
CROSS_DISCOUNT = 0.5
CROSS_FAN_IN = 20
"""Records linking to the direct hits read per result asked for: any number of records may
cite one record, and a search with ``cross`` read them all (34,000 links: 1.8 s)."""
_OVERFETCH = 4
_MIN_CHUNK = 16  # candidate records loaded from the store at a time: limit x overfetch or this
_MAX_READ = 1000
"""The most candidates one search reads while authors at trust 0 leave it short of its limit."""


@dataclass(frozen=True)
class SearchQuery:
    fleet_id: str
    text: str
    limit: int = 10
    run_id: str | None = None
    domain: str = ""
    cross: bool = False
    mode: str = "hybrid"
    tags: tuple[str, ...] = ()
    tags_any: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    agent_id: str = ""
    created_after_us: int | None = None
    created_before_us: int | None = None
    min_importance: float | None = None

    def record_filter(self) -> RecordFilter:
        """The query's conditions; originals a compaction summary covers leave search to it."""
        return RecordFilter(self.fleet_id, run_id=self.run_id, domain=self.domain,
                            agent_id=self.agent_id, tags=self.tags, exclude_compacted=True,
                            tags_any=self.tags_any, metadata=self.metadata,
                            created_after_us=self.created_after_us,
                            created_before_us=self.created_before_us,
                            min_importance=self.min_importance)


@dataclass(frozen=True)
class SearchHit:
    record: Record
    score: float
    via: str = "direct"


class SearchEngine:
    def __init__(self, database: Database, repo: ShardRepository, *,
                 trust: TrustSource | None = None,
                 index: SearchIndex | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = database
        self.repo = repo
        self.trust = trust
        self.index = index
        self.clock = clock

    def search(self, query: SearchQuery) -> list[SearchHit]:
        if not query.text.strip():
            raise InvalidArgument("query is empty", reason="EMPTY_QUERY")
        if not 1 <= query.limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be 1..{MAX_LIMIT}, got {query.limit}",
                                  reason="INVALID_LIMIT")
        if query.mode not in ("lexical", "semantic", "hybrid"):
            raise InvalidArgument(f"unknown search mode {query.mode!r}", reason="INVALID_MODE")
        if query.mode == "semantic" and (self.index is None or self.index.embedder is None):
            raise FailedPrecondition(
                "semantic search needs an embedding provider; this shard runs lexical only",
                reason="SEMANTIC_UNAVAILABLE")
        flt = query.record_filter()
        if self.index is not None and not query.cross:
            # The index first (its catch-up takes a connection of its own), then the
            # candidates on a Core connection, not an ORM session (its begin, commit and
            # close), and trust asked with none held. One connection at a time: a search
            # holding one while the index's catch-up waited for another stalled every search
            # for the pool's timeout once the pool ran short (review, 2026-11-30).
            return self._best(query, flt, self._candidates(query, flt), self.db.reading)
        with self.db.session() as session:  # its connection is taken at its first statement
            if self.index is not None:
                hits = self._best(query, flt, self._candidates(query, flt),
                                  lambda: nullcontext(session))
            else:  # no in-memory index: the store's full-text search
                found = self.repo.lexical(session, flt, query.text, query.limit * _OVERFETCH)
                hits = self._rank(query.fleet_id, found, "direct")[: query.limit]
            if query.cross and hits:
                hits = self._expand(session, query, flt, hits)
        return hits

    def _best(self, query: SearchQuery, flt: RecordFilter, ranked: Sequence[tuple[str, float]],
              reader: Callable[[], AbstractContextManager[Session | Connection]]
              ) -> list[SearchHit]:
        """The ``limit`` best hits of the index's ranking: its best candidates read and ranked
        with importance, recency and trust, and more read while records of authors at trust 0
        (left out) leave fewer than ``limit``, up to :data:`_MAX_READ` candidates. Before
        2026-11-30 only the first ``limit x 4`` were read, and 40 well-matching records naming
        a suspended author emptied every search they matched (found by review). Trust is asked
        with no connection held."""
        hits: list[SearchHit] = []
        at = 0
        while True:
            with reader() as connection:
                found, at = self._load(connection, query, flt, ranked, at)
            hits += self._rank(query.fleet_id, found, "direct")
            if len(hits) >= query.limit or at >= min(len(ranked), _MAX_READ):
                hits.sort(key=lambda hit: hit.score, reverse=True)
                return hits[: query.limit]

    def _candidates(self, query: SearchQuery, flt: RecordFilter) -> list[tuple[str, float]]:
        """The index's ranking (record id, relevance), best first."""
        assert self.index is not None
        return self.index.search(query.fleet_id, query.text, query.mode,
                                 doc_filter=_doc_filter(flt))

    def _load(self, reader: Session | Connection, query: SearchQuery, flt: RecordFilter,
              found: Sequence[tuple[str, float]], at: int = 0
              ) -> tuple[list[tuple[Record, float]], int]:
        """The stored records of the best candidates from position ``at``, with their
        relevance, and the position after the last candidate read."""
        want = query.limit * _OVERFETCH
        out: list[tuple[Record, float]] = []
        # The index filtered before ranking; compaction (and a re-check of the filter against
        # the stored record) apply to the ranked candidates, a chunk at a time.
        chunk = max(want, _MIN_CHUNK)
        while at < len(found):
            part = found[at : at + chunk]
            at += len(part)
            ids = [rid for rid, _ in part]
            records = self.repo.live_by_ids(reader, query.fleet_id, ids)
            for rid, relevance in part:
                record = records.get(rid)
                if record is None or not flt.matches(record):
                    continue
                out.append((record, max(relevance, 1e-9)))
            if len(out) >= want:
                break
        return out, at

    def _rank(self, fleet_id: str, found: Sequence[tuple[Record, float]],
              via: str) -> list[SearchHit]:
        trusts = self._trusts(fleet_id, [r for r, _ in found])
        now_us = self.clock() * 1_000_000
        ranked = []
        for record, relevance in found:
            trust = trusts[record.id]
            if trust <= 0.0:
                continue
            age_s = max(0.0, (now_us - record.created_us) / 1_000_000)
            ranked.append(SearchHit(record, final_score(relevance, record.importance, age_s,
                                                        trust), via))
        ranked.sort(key=lambda hit: hit.score, reverse=True)
        return ranked

    def _trusts(self, fleet_id: str, found: Sequence[Record]) -> dict[str, float]:
        """Each record's trust: the lowest of its authors' (a summary's sources count), in one
        lookup for all of them; 0 means left out."""
        authors = {r.id: record_authors(r) for r in found}
        multipliers = self.multipliers(
            fleet_id, set().union(*(names for names in authors.values() if names is not None)))
        return {rid: 0.0 if names is None else min(multipliers.get(a, 1.0) for a in names)
                for rid, names in authors.items()}

    def _expand(self, session, query: SearchQuery, flt: RecordFilter,  # type: ignore[no-untyped-def]
                hits: list[SearchHit]) -> list[SearchHit]:
        """Seed 001 cross-shard search: follow links out of (and into) the direct hits."""
        seen = {hit.record.id for hit in hits}
        base = min(hit.score for hit in hits) * CROSS_DISCOUNT
        ids = [hit.record.id for hit in hits]
        refs = self.repo.links_from(session, query.fleet_id, ids)
        linked_ids = {r.target for r in refs if r.kind == "record"}
        linked_ids.update(self.repo.linking_to(session, query.fleet_id, ids,
                                               CROSS_FAN_IN * query.limit))
        # Linked records obey the query's filters too, and compacted originals stay out.
        linked = self.repo.by_ids(session, query.fleet_id, sorted(linked_ids - seen),
                                  exclude_compacted=True)
        extra: list[tuple[Record, float]] = [
            (record, base) for record in linked.values() if flt.matches(record)
        ]
        for ref in {r for r in refs if r.kind == "domain"}:
            in_domain = dataclasses.replace(flt, domain=ref.target)
            for record, relevance in self.repo.lexical(session, in_domain, query.text,
                                                       query.limit):
                if record.id not in seen:
                    extra.append((record, relevance * CROSS_DISCOUNT))
        followed = self._rank(query.fleet_id, extra, "cross_ref")
        merged = {hit.record.id: hit for hit in followed if hit.record.id not in seen}
        return hits + sorted(merged.values(), key=lambda h: h.score, reverse=True)[: query.limit]

    def multipliers(self, fleet_id: str, agent_ids: set[str]) -> dict[str, float]:
        if self.trust is None or not agent_ids:
            return {}
        return self.trust.multipliers(fleet_id, agent_ids)

    def neighbours(self, fleet_id: str, content: str, limit: int = 5) -> list[Neighbour]:
        """Nearest existing records, sent to governance to judge contradictions: none that a
        summary replaced, and none of an author at trust 0 (a suspended agent's statement
        made an honest correction of it a denied contradiction, and the corrector's trust
        fell with each denial: found by review on 2026-11-30)."""
        with self.db.session() as session:
            found = self.repo.lexical(session, RecordFilter(fleet_id, exclude_compacted=True),
                                      content, limit * _OVERFETCH)
        trusts = self._trusts(fleet_id, [r for r, _ in found])
        return [Neighbour(r.id, r.content, r.agent_id, score) for r, score in found
                if trusts[r.id] > 0.0][:limit]

    def duplicates(self, fleet_id: str, agent_id: str, contents: list[str], run_ids: list[str],
                   *, mode: str, threshold: float) -> list[Duplicate | None]:
        """What each of the author's contents duplicates (stored records or an earlier
        content); None: new."""
        if mode == "off" or self.index is None:
            return [None] * len(contents)
        return self.index.duplicates(fleet_id, agent_id, contents, run_ids,
                                     semantic=mode == "semantic", threshold=threshold)

    def notify_written(self, records: Sequence[Record]) -> None:
        """Called after each committed group: the full-text index is current, vectors follow."""
        if self.index is not None and records:
            self.index.notify()

    def indexing_lag(self, fleet_id: str) -> int:
        """The fleet's records not yet in the vector index."""
        return self.index.lag(fleet_id) if self.index is not None else 0

    def embedding_model(self) -> str:
        if self.index is None or self.index.embedder is None:
            return ""
        return self.index.embedder.name

    def previous_embedding_model(self) -> str:
        """The model whose vectors a re-embedding still serves; empty when none."""
        previous = self.index.previous if self.index is not None else None
        return previous.name if previous is not None else ""


MAX_SOURCE_AUTHORS = 64
"""Authors a record may name and still rank (a compaction summary names at most MAX_GROUP, 40):
one naming more ranks at 0 with none of them looked up. 8 KiB of ``source_authors`` names
about 1,100 made-up agents, and a search of 400 such candidates asked governance about
467,000 of them, some 935 calls (found in review, 2026-11-30)."""


def record_authors(record: Record) -> frozenset[str] | None:
    """The record's author and the authors it names as its sources (``source_authors``, a JSON
    list): its trust is the lowest of theirs, so naming more can only lower it; None: it
    names more than MAX_SOURCE_AUTHORS, and ranks at 0.

    The value is free text any writer may set, read by every search of the fleet: anything
    but a list of agent ids (JSON nested past the parser's depth, a name no agent can have)
    is left out here, never sent on to governance, whose refusal of the whole lookup would
    otherwise reach every author in it."""
    named = record.metadata.get(SOURCE_AUTHORS_KEY)
    if not named:
        return frozenset((record.agent_id,))
    try:
        listed = json.loads(named)
    except (ValueError, RecursionError):
        listed = None
    if not isinstance(listed, list):  # the writer's own free text: it can only lower its rank
        return frozenset((record.agent_id,))
    authors = frozenset((record.agent_id,
                         *(a for a in listed if isinstance(a, str) and is_identifier(a))))
    return authors if len(authors) <= MAX_SOURCE_AUTHORS + 1 else None


def _doc_filter(flt: RecordFilter) -> DocFilter:
    return DocFilter(run_id=flt.run_id, domain=flt.domain, agent_id=flt.agent_id,
                     tags_all=flt.tags, tags_any=flt.tags_any, metadata=flt.metadata,
                     created_after_us=flt.created_after_us,
                     created_before_us=flt.created_before_us,
                     min_importance=flt.min_importance)


__all__ = ["CrossRef", "SearchEngine", "SearchHit", "SearchQuery"]
