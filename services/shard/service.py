"""ShardService: the shard's use cases, independent of gRPC.

Writes: validate -> route -> resolve cross-references -> derive ids -> skip
what already exists -> ask the governance gate -> group-commit. A batch is all
or nothing. Reads are scoped to the caller's fleet; the author of a record is
always the authenticated caller.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session

from services.common.commitment import new_salt
from services.common.db import Database
from services.common.erasure_source import (
    ErasureSource,
    TextScans,
    is_erasure_id,
    still_wanted,
)
from services.common.errors import (
    Aborted,
    AlreadyExists,
    EngramError,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from services.common.group_commit import GroupCommit
from services.common.limits import check_limit, validate_request_id
from services.common.metrics import Tally
from services.common.settings import LIMIT_DEFAULTS, LimitsSettings
from services.common.storage_errors import outcome_known
from services.common.tokens import Principal, is_identifier, validate_identifier
from services.common.tombstone_audit import (
    NOT_IN_ERASURE,
    ErasureLookup,
    RecordedErasures,
)
from services.shard.domain import crossrefs, records
from services.shard.domain.compaction import SUMMARY_SOURCE
from services.shard.domain.domains import (
    DEFAULT_DOMAINS,
    Domain,
    route,
    validate_domain_name,
    validate_domain_text,
    validate_keywords,
    with_importance,
)
from services.shard.domain.records import Record, RecordDraft
from services.shard.ports import GateCandidate, TrustSource, WriteGate
from services.shard.repository import RecordFilter, RecordPage, RequestClaim, ShardRepository
from services.shard.search.engine import SearchEngine, SearchHit, SearchQuery
from services.shard.search.index import BatchDuplicate, SearchIndex, StoredDuplicate

log = logging.getLogger("engram.shard")

SNAPSHOT_PAGE = 100
"""Records a SnapshotForRun stream reads per session (at most ~3 MB at 32 KB each)."""
T = TypeVar("T")
R = TypeVar("R")
_DOMAIN_CACHE_S = 1.0
_ERASURE_RACE_ATTEMPTS = 3
"""Times a write is prepared again when an erasure takes the record it was landing on."""
_LATEST_CREATED_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
_DECISION_ID_CHARS = 64  # the records table's column, and governance's


class _ErasedMeanwhile(Exception):
    """A record id a write was inserting has been erased since the write found it."""


class SourcesErased(Exception):
    """Originals a compaction summary quotes were erased before it committed: it is not
    stored (it would keep erased text)."""

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__(f"{len(ids)} originals erased meanwhile")
        self.ids = list(ids)


@dataclass(frozen=True)
class WriteResult:
    record: Record
    created: bool
    duplicate_of: str = ""


@dataclass(frozen=True)
class _WriteJob:
    fleet_id: str
    agent_id: str
    records: tuple[Record, ...]
    request_id: str
    digest: str
    request_ids: tuple[str, ...] = ()
    """The id of the record answering each input of the request, in order (a duplicate's is
    its original's): a replay returns one result per input."""
    write_keys: tuple[tuple[str, str], ...] = ()
    """``(record id, write key)`` of the format-2 records: claimed with them."""
    compacts: tuple[Record, ...] = ()
    """The originals this job's one record (a compaction summary) replaces: marked in the
    same transaction, and the job fails if an erasure took one of them meanwhile."""


@dataclass(frozen=True)
class FleetStatus:
    fleet_id: str
    total_records: int
    runs: int
    total_links: int
    domains: list[Domain]
    incoming: dict[str, int]
    """Links into each domain from records."""
    indexing_lag: int
    embedding_model: str
    """The embedder's identity (stored vectors are keyed by it); empty when lexical only."""
    previous_embedding_model: str = ""
    """The model whose vectors a re-embedding still serves (ENGRAM_SHARD_PREVIOUS_EMBEDDER)."""


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    failures: list[EngramError]
    tombstoned: int = 0
    unconfirmed: int = 0
    """Of ``tombstoned``, those whose erasure governance could not be asked about."""


ERASED_KINDS = ("record", "summary")
"""The kinds under which an erasure lists a record (a compaction summary is a record)."""
AUDIT_CHUNK = 1000
"""Tombstones read, checked and audited together in a whole-fleet verification in one call:
the database session is closed before governance is asked, and memory stays bounded."""


class ShardService:
    def __init__(
        self,
        database: Database,
        *,
        gate: WriteGate | None = None,
        trust: TrustSource | None = None,
        index: SearchIndex | None = None,
        clock: Callable[[], float] = time.time,
        dedup: str = "off",
        dedup_similarity: float = 0.97,
        limits: LimitsSettings = LIMIT_DEFAULTS,
    ) -> None:
        self.db = database
        self.limits = limits
        self.dedup, self.dedup_similarity = dedup, dedup_similarity
        self.repo = ShardRepository(database.dialect)
        self.recorded_erasures = RecordedErasures()  # what VerifyRecords read from governance
        self.written = Tally()
        self.whole_fleet_checks = TextScans()
        """``VerifyRecords`` with ``all`` re-hashes every record of a fleet (about 50 µs each):
        at most two at once on a replica (SCAN_BUSY beyond), each stopped when its caller goes."""
        self.erased = Tally()
        """Records erased (engram forget), by kind: record, or a summary that quoted one."""
        """Records stored by committed writes (not those a retry or a duplicate found)."""
        self.integrity_failures = Tally()
        """Records that failed verification (VerifyRecords, a verified snapshot), by reason."""
        self.gate = gate
        self.clock = clock
        self.search_engine = SearchEngine(
            database, self.repo, trust=trust, index=index, clock=clock
        )
        self._committer: GroupCommit[_WriteJob, list[WriteResult]] = GroupCommit(
            self._apply, alone_after=outcome_known)
        self._domain_cache: dict[str, tuple[float, list[Domain]]] = {}
        self._fleet_secrets: dict[str, tuple[bytes, bool]] = {}
        self._domain_lock = threading.Lock()

    # -- domains ------------------------------------------------------------

    def domains(self, fleet_id: str, *, fresh: bool = False) -> list[Domain]:
        now = self.clock()
        cached = self._domain_cache.get(fleet_id)
        if cached and not fresh and now - cached[0] < _DOMAIN_CACHE_S:
            return cached[1]
        with self._domain_lock, self.db.session() as session:
            found = self.repo.domains(session, fleet_id)
            if not found:
                self.repo.add_domains(session, fleet_id, DEFAULT_DOMAINS)
                found = list(DEFAULT_DOMAINS)
        ranked = with_importance(found, now)
        self._domain_cache[fleet_id] = (now, ranked)
        return ranked

    def upsert_domain(self, principal: Principal, name: str, display_name: str,
                      description: str, keywords: Sequence[str]) -> tuple[Domain, bool]:
        name = validate_domain_name(name)
        words = validate_keywords(keywords)
        validate_domain_text(display_name, description)
        try:
            return self._upsert_domain(principal.fleet_id, name, display_name, description,
                                       words)
        except DbIntegrityError:  # a concurrent call created it first: update that one
            return self._upsert_domain(principal.fleet_id, name, display_name, description,
                                       words)
        finally:
            self._domain_cache.pop(principal.fleet_id, None)

    def _upsert_domain(self, fleet_id: str, name: str, display_name: str, description: str,
                       words: tuple[str, ...]) -> tuple[Domain, bool]:
        existing = {d.name: d for d in self.domains(fleet_id, fresh=True)}
        now = self.clock()
        with self.db.session() as session:
            if name in existing:
                old = existing[name]
                domain = replace(old, display_name=display_name or old.display_name,
                                 description=description or old.description,
                                 keywords=words or old.keywords, updated_ts=now)
                self.repo.update_domain(session, fleet_id, domain)
                return domain, False
            domain = Domain(name, display_name or name.title(), description, words,
                            updated_ts=now)
            self.repo.add_domains(session, fleet_id, [domain])
            return domain, True

    # -- writes -------------------------------------------------------------

    def write(self, principal: Principal, drafts: Sequence[RecordDraft],
              request_id: str = "", *, compacts: Sequence[Record] = ()) -> list[WriteResult]:
        """Store ``drafts`` (gated); with ``compacts``, the one draft is the compaction summary
        of those originals, marked with it in its commit (:class:`SourcesErased` if an erasure
        took one first)."""
        if not drafts:
            raise InvalidArgument("no records to write", reason="EMPTY_BATCH")
        check_limit("a batch", len(drafts), self.limits.batch_items, "ENGRAM_LIMITS_BATCH_ITEMS",
                    "records", reason="BATCH_TOO_LARGE")
        if request_id:
            validate_request_id(request_id)
        fleet, agent = principal.fleet_id, principal.agent_id
        normalized = [_at_index(i, len(drafts),
                                lambda d: records.normalize_draft(d, self.limits), draft)
                      for i, draft in enumerate(drafts)]
        digest = _digest(normalized)
        shas = [records.content_hash(d.content) for d in normalized]
        secret, legacy_held = self._fleet_secret(fleet)

        def assign(session: Session) -> tuple[list[str], dict[str, str]]:
            return self._assign_ids(session, fleet, agent, normalized, shas, secret,
                                    legacy_held)

        # The replay lookup and the ids' lookup share one read session (each session costs
        # a pool checkout, a commit and a close: about a tenth of an ungated write's CPU).
        with self.db.session() as session:
            assigned = assign(session)
            if request_id:
                replay = self._replay(session, fleet, agent, request_id, digest, assigned[0])
                if replay is not None:
                    return replay
        for _ in range(_ERASURE_RACE_ATTEMPTS):
            try:
                return self._write_attempt(principal, normalized, digest, request_id,
                                           tuple(compacts), shas, assigned)
            except _ErasedMeanwhile:
                # An erasure took the record this write's text had landed on (its write key)
                # while the write was prepared: write it anew, under a new id.
                with self.db.session() as session:
                    assigned = assign(session)
                continue
        raise Aborted("erasures kept taking the records this write was landing on; retry",
                      reason="ERASURE_RACE")

    def _write_attempt(self, principal: Principal, normalized: Sequence[RecordDraft],
                       digest: str, request_id: str, compacts: tuple[Record, ...],
                       shas: Sequence[str],
                       assigned: tuple[list[str], dict[str, str]]) -> list[WriteResult]:
        fleet, agent = principal.fleet_id, principal.agent_id
        domains = self.domains(fleet)
        known = {d.name for d in domains}
        ids, keys = assigned
        refs = self._resolve_cross_refs(fleet, normalized, ids, known)
        now_us = int(self.clock() * 1_000_000)
        prepared: list[Record] = []
        for index, draft in enumerate(normalized):
            domain = draft.domain
            if domain:
                domain = _at_index(index, len(normalized), validate_domain_name, domain)
                if domain not in known:
                    raise _indexed(index, len(normalized), InvalidArgument(
                        f"unknown domain {domain!r}; known domains: {', '.join(sorted(known))} "
                        "(add one with UpsertDomain)", reason="UNKNOWN_DOMAIN"))
            else:
                domain = route(draft.content, domains)
            salt = new_salt()
            prepared.append(Record(
                id=ids[index],
                fleet_id=fleet, run_id=draft.run_id, agent_id=agent, content=draft.content,
                content_hash=shas[index], record_hash="", domain=domain, source=draft.source,
                importance=draft.importance, tags=draft.tags, metadata=dict(draft.metadata),
                cross_refs=refs[index], created_us=now_us, format=records.FORMAT, salt=salt,
                body_commitment=records.body_commitment(salt, draft.content, draft.tags,
                                                        dict(draft.metadata)),
            ))
        existing: dict[str, Record] = {}
        landed = [r.id for r in prepared if r.id not in keys]  # a fresh random id is new
        if self.gate is not None and landed:
            # Only what is new goes to the gate; the commit re-checks under its lock anyway.
            with self.db.session() as session:
                existing = self.repo.existing(session, landed)
        fresh: list[Record] = []
        seen: set[str] = set()
        for record in prepared:
            if record.id not in existing and record.id not in seen:
                fresh.append(record)
                seen.add(record.id)
        # Only a record with a new id can be a duplicate: one that landed on a stored id (its
        # write key, or a derived id) is that record, answered as stored by the commit, as the
        # gated path's check above does (a landed text with a near-duplicate beside it was
        # answered as that other record).
        duplicate_of = self._duplicates(fleet, agent, [r for r in fresh if r.id in keys])
        fresh = [r for r in fresh if r.id not in duplicate_of]
        # The gate's idempotency key comes from the client's request_id (a content digest alone
        # would replay an old decision, say before a suspension, for a later identical write),
        # bound to the whole body: a decision is never replayed for metadata it did not judge.
        fresh = self._gate(principal, fresh, _gate_key(request_id, digest, fresh))
        job = _WriteJob(fleet, agent, tuple(records.seal(r) for r in fresh), request_id, digest,
                        tuple(_answered_by(r.id, duplicate_of) for r in prepared),
                        tuple((r.id, keys[r.id]) for r in fresh if r.id in keys), compacts)
        # By the id each record was prepared with: a record that lost a race to an equal
        # concurrent write answers with the winner's record.
        stored = (dict(zip([r.id for r in job.records], self._committer.submit(job),
                           strict=True)) if fresh else {})
        results: list[WriteResult] = []
        reported: set[str] = set()
        for r in prepared:
            if r.id in duplicate_of:
                original = duplicate_of[r.id]
                if isinstance(original, str):  # an earlier record of this batch, now stored
                    original = stored[original].record
                results.append(WriteResult(original, created=False, duplicate_of=original.id))
            elif r.id in existing:
                results.append(WriteResult(existing[r.id], created=False))
            else:
                created = stored[r.id].created and r.id not in reported
                results.append(WriteResult(stored[r.id].record, created=created))
            reported.add(r.id)
        return results

    def _assign_ids(self, session: Session, fleet: str, agent: str,
                    drafts: Sequence[RecordDraft], shas: Sequence[str], secret: bytes,
                    legacy_held: bool) -> tuple[list[str], dict[str, str]]:
        """Each draft's record id, and the write key of each new id.

        A draft written before (same run, author and content) gets the id it landed on: a
        format-2 record's through its write key, a format-1 record's by derivation. Any
        other gets a random id (the same one for equal drafts of the batch)."""
        keys = [records.write_key(secret, d.run_id, agent, d.content) for d in drafts]
        legacy = [records.record_id(fleet, d.run_id, agent, sha)
                  for d, sha in zip(drafts, shas, strict=True)]
        found = self.repo.ids_for_keys(session, fleet, keys)
        missing = [old for key, old in zip(keys, legacy, strict=True) if key not in found]
        # A fleet written only since format 2 holds no derived id: no query for them.
        old_ids = (set(self.repo.existing(session, missing))
                   if missing and legacy_held else set())
        ids: list[str] = []
        new_keys: dict[str, str] = {}
        for key, old in zip(keys, legacy, strict=True):
            if key in found:
                ids.append(found[key])
            elif old in old_ids:
                ids.append(old)
            else:
                record_id = found[key] = records.new_record_id()
                new_keys[record_id] = key
                ids.append(record_id)
        return ids, new_keys

    def _fleet_secret(self, fleet: str) -> tuple[bytes, bool]:
        """The fleet's write-key secret, and whether it holds format-1 records (read once a
        process; an import of format-1 records sets it)."""
        cached = self._fleet_secrets.get(fleet)
        if cached is None:
            with self.db.session() as session:
                cached = (self.repo.fleet_secret(session, fleet),
                          self.repo.holds_format_1(session, fleet))
            self._fleet_secrets[fleet] = cached
        return cached

    def _duplicates(self, fleet: str, agent: str, fresh: list[Record]) -> dict[str, Record | str]:
        """New record id -> the stored record it duplicates, or the id of an earlier record of
        the same batch; only the same author's, in the same run (a run's snapshot holds what
        it wrote, and another author's record would vanish with that author's trust)."""
        found = self.search_engine.duplicates(fleet, agent, [r.content for r in fresh],
                                              [r.run_id for r in fresh], mode=self.dedup,
                                              threshold=self.dedup_similarity)
        if not any(found):
            return {}
        with self.db.session() as session:
            stored = self.repo.by_ids(session, fleet, [i for f in found
                                                       if isinstance(f, StoredDuplicate)
                                                       for i in f.record_ids])
        out: dict[str, Record | str] = {}
        for record, target in zip(fresh, found, strict=True):
            if isinstance(target, BatchDuplicate):
                first = fresh[target.index]
                if first.run_id == record.run_id:
                    earliest = out.get(first.id, first.id)
                    out[record.id] = earliest
            elif isinstance(target, StoredDuplicate):
                own = [stored[i] for i in target.record_ids if i in stored
                       and stored[i].run_id == record.run_id and stored[i].agent_id == agent]
                if own:
                    out[record.id] = own[0]
        return out

    def _replay(self, session: Session, fleet: str, agent: str, request_id: str,
                digest: str, landing: Sequence[str]) -> list[WriteResult] | None:
        """The first answer to ``request_id`` again, one result per input (``landing``: the id
        each input lands on now, through its write key, its derived id, or a new random one);
        None when the request writes anew."""
        found = self.repo.find_request(session, fleet, agent, request_id)
        if found is None:
            return None
        recorded_digest, ids = found
        if recorded_digest != digest:
            raise _request_id_reused(request_id)
        stored = self.repo.by_ids(session, fleet, ids)
        if len(ids) != len(landing) or any(i not in stored for i in ids):
            # Some of what it stored is gone (retention), or the row predates answers by
            # input: the request writes anew, which finds what is left by its write keys.
            return None
        # An input answered by a record it does not land on itself was a duplicate of it.
        return [WriteResult(stored[i], created=False, duplicate_of=i if i != own else "")
                for i, own in zip(ids, landing, strict=True)]

    def _resolve_cross_refs(self, fleet: str, drafts: Sequence[RecordDraft], ids: Sequence[str],
                            known: set[str]) -> list[tuple[str, ...]]:
        """Each draft's references as ``domain:<name>`` / ``record:<id>``; unknown targets fail."""
        targets_by_draft = [crossrefs.detect(d.content) for d in drafts]
        if not any(targets_by_draft):
            return [() for _ in drafts]
        for index, targets in enumerate(targets_by_draft):
            _at_index(index, len(drafts), crossrefs.check_count, targets)
        record_targets = {t for ts in targets_by_draft for t in ts
                          if crossrefs.looks_like_record_id(t)} - set(ids)
        found: set[str] = set()
        if record_targets:
            with self.db.session() as session:
                found = set(self.repo.by_ids(session, fleet, sorted(record_targets)))
        resolved: list[tuple[str, ...]] = []
        for index, targets in enumerate(targets_by_draft):
            refs: list[str] = []
            for target in targets:
                name = target.removeprefix("shard_")
                if name in known:
                    refs.append(f"domain:{name}")
                elif target in found or (target in ids and target != ids[index]):
                    refs.append(f"record:{target}")
                else:
                    raise _indexed(index, len(drafts), InvalidArgument(
                        f"cross-reference to {target!r}: no domain or record of that name "
                        "exists in this fleet", reason="CROSS_REFERENCE_TARGET_NOT_FOUND",
                        metadata={"target": target}))
            resolved.append(tuple(dict.fromkeys(refs)))
        return resolved

    def _gate(self, principal: Principal, fresh: list[Record], request_key: str) -> list[Record]:
        if self.gate is None or not fresh:
            return fresh
        fleet = principal.fleet_id
        candidates = [
            GateCandidate(
                record_id=r.id, content_hash=records.gate_hash(r), content=r.content,
                run_id=r.run_id,
                domain=r.domain, source=r.source, importance=r.importance, tags=r.tags,
                metadata=tuple(sorted(r.metadata.items())),
            )
            for r in fresh
        ]
        # The neighbour search runs only if governance asks (a contradiction rule applies).
        decisions = self.gate.decide(
            fleet, principal.agent_id, candidates, request_key,
            lambda c: self.search_engine.neighbours(fleet, c.content))
        denied = [(i, d) for i, d in enumerate(decisions) if not d.allowed]
        if denied:
            index, decision = denied[0]
            rule_ids = sorted({rule for _, d in denied for rule in d.rule_ids})
            where = f"record {index}: " if len(fresh) > 1 else ""
            raise PermissionDenied(
                f"{where}governance denied the write: {decision.reason}",
                reason="GATE_DENIED",
                metadata={"rule_ids": ",".join(rule_ids), "decision_id": decision.decision_id},
            )
        return [replace(r, gate_decision_id=d.decision_id)
                for r, d in zip(fresh, decisions, strict=True)]

    def _apply(self, jobs: Sequence[_WriteJob]) -> list[list[WriteResult]]:
        """Leader side of the group commit: every job of the group in one transaction."""
        results: list[list[WriteResult]] = []
        now = self.clock()
        with self.db.session() as session:
            # A record with a write key to claim has a fresh random id: only the others (ids
            # found through a write key or derived, format 1) can be stored already.
            keyed = {record_id for job in jobs for record_id, _ in job.write_keys}
            already = self.repo.existing(
                session, [r.id for job in jobs for r in job.records if r.id not in keyed])
            inserted: set[str] = set()
            unsent: list[Record] = []
            usage: dict[tuple[str, str], int] = {}
            # Every new record's write key, the group's in one statement; a key a concurrent
            # write (or an earlier job of this group) claimed first answers with its record.
            lost = self.repo.claim_write_keys(session, [
                (job.fleet_id, record_id, key) for job in jobs
                for record_id, key in job.write_keys if record_id not in already])
            if lost:
                pending = {r.id: r for job in jobs for r in job.records}
                stored = self.repo.existing(session, set(lost.values()))
                already.update({mine: stored.get(won) or pending[won]
                                for mine, won in lost.items()})
            # Every job's request_id, the group's in one statement, before the records go in:
            # a refused reuse stores nothing.
            # Recorded by the id of the record that answers each input: a record that lost a
            # race to an equal write (or to an earlier job of the group) by the winner's.
            taken = self.repo.claim_requests(session, [
                RequestClaim(job.fleet_id, job.agent_id, job.request_id, job.digest,
                             [already[i].id if i in already else i
                              for i in job.request_ids or [r.id for r in job.records]])
                for job in jobs if job.request_id], int(now * 1_000_000))
            for job in jobs:
                recorded = taken.get((job.fleet_id, job.agent_id, job.request_id))
                if job.request_id and recorded is not None and recorded != job.digest:
                    raise _request_id_reused(job.request_id)
                fresh = [r for r in job.records if r.id not in already and r.id not in inserted]
                unsent += fresh  # the group's records go in together: two statements, not 2N
                if job.compacts:
                    self.repo.insert(session, unsent)  # the summary exists before it is named
                    unsent = []
                    summary = already.get(job.records[0].id, job.records[0])
                    self._mark_compacted(session, job.fleet_id, summary.id, job.compacts,
                                         int(now * 1_000_000))
                inserted.update(r.id for r in fresh)
                for r in fresh:
                    usage[(job.fleet_id, r.domain)] = usage.get((job.fleet_id, r.domain), 0) + 1
                results.append([
                    WriteResult(already.get(r.id, r), created=r.id not in already)
                    for r in job.records
                ])
            self.repo.insert(session, unsent)
            # An id this group inserts was erased meanwhile (a write that found it through its
            # write key before the erasure committed): never store content under an erased id.
            # Checked after the inserts: they hold SQLite's write lock, and on Postgres wait
            # for an erasure deleting the same id to commit.
            if inserted and (raced := self.repo.erased_among(session, sorted(inserted))):
                raise _ErasedMeanwhile(raced)
            for fleet in {fleet for fleet, _ in usage}:
                current = {d.name: d for d in self.repo.domains(session, fleet)}
                self.repo.record_usage(session, fleet, [
                    current[name].used(count, now)
                    for (f, name), count in usage.items() if f == fleet and name in current
                ])
        self.search_engine.notify_written([r for job in jobs for r in job.records])
        self.written.add(amount=len(inserted))
        return results

    def mark_compacted(self, fleet_id: str, summary_id: str,
                       originals: Sequence[Record]) -> None:
        """Mark ``originals`` replaced by a summary stored before (a summary written again
        finds the first; its write had nothing to commit)."""
        with self.db.session() as session:
            self._mark_compacted(session, fleet_id, summary_id, originals,
                                 int(self.clock() * 1_000_000))

    def _mark_compacted(self, session: Session, fleet_id: str, summary_id: str,
                        originals: Sequence[Record], now_us: int) -> None:
        """Locked first: an erasure deleting an original waits for this commit (and then finds
        the summary quoting it), or this waits for the erasure's and sees the original gone."""
        ids = [r.id for r in originals]
        present = self.repo.lock_records(session, ids)
        gone = [i for i in ids if i not in present]
        if gone:
            raise SourcesErased(gone)
        covered = self.repo.compacted_among(session, ids)
        fresh = [r for r in originals if r.id not in covered]
        if fresh:
            self.repo.mark_compacted(session, fleet_id, summary_id, fresh, now_us)

    # -- imports ------------------------------------------------------------

    def import_records(self, principal: Principal,
                       imported: Sequence[Record]) -> tuple[int, int]:
        """Stores records exported from another instance as they were (``engram
        import-bundle``): ``(created, already_present)``. Every record must re-hash, derive its
        id, belong to the caller's fleet, name a known domain and be one this service could have
        stored (its limits); otherwise nothing is stored and the error names the record. A
        record already stored identically is left alone; a different one under its id is
        ALREADY_EXISTS. The gate is not asked again: the record keeps the decision that let it
        in where it was written, under its record_hash."""
        if not imported:
            raise InvalidArgument("no records to import", reason="EMPTY_BATCH")
        check_limit("an import batch", len(imported), self.limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS", "records", reason="BATCH_TOO_LARGE")
        fleet = principal.fleet_id
        known = {d.name for d in self.domains(fleet, fresh=True)}
        total = len(imported)
        for index, record in enumerate(imported):
            _at_index(index, total, lambda r: self._check_import(r, fleet, known), record)
        try:
            fresh = self._store_imported(imported, fleet)
        except DbIntegrityError:
            # A concurrent import stored some of them first: look again, once.
            fresh = self._store_imported(imported, fleet)
        self.search_engine.notify_written(fresh)
        return len(fresh), total - len(fresh)

    def lock_imports(self, session: Session) -> None:
        """Imports of records and of tombstones take turns until the transaction ends: each
        checks the other's table before it writes, and neither can lock a row that is not there
        yet (both could commit, a record beside its tombstone). SQLite: the write lock of
        ``db.writing()`` already serialises them; Postgres: one advisory transaction lock
        (record ids are global, so not one per fleet; imports are rare)."""
        if self.db.dialect != "sqlite":  # one key for every fleet: record ids are global
            session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                            {"key": "engram-import"})

    def _store_imported(self, imported: Sequence[Record], fleet: str) -> list[Record]:
        total = len(imported)
        with self.db.writing() as session:
            self.lock_imports(session)
            stored = self.repo.existing(session, [r.id for r in imported])
            erased = self.repo.erased_among(session, [r.id for r in imported
                                                      if r.id not in stored])
            for index, record in enumerate(imported):
                if record.id in erased:  # a bundle made before an erasure brings nothing back
                    raise _indexed(index, total, FailedPrecondition(
                        f"record {record.id} was erased here (erasure {erased[record.id]}); "
                        "an erased record is never imported again", reason="RECORD_ERASED",
                        metadata={"record_id": record.id, "erasure_id": erased[record.id]}))
            fresh: dict[str, Record] = {}
            for index, record in enumerate(imported):
                other = stored.get(record.id) or fresh.get(record.id)
                if other is None:
                    fresh[record.id] = record
                elif other.fleet_id != fleet:  # nothing of the other fleet's record is said
                    raise _indexed(index, total, AlreadyExists(
                        f"record id {record.id} is taken on this instance; nothing was imported",
                        reason="RECORD_CONFLICT", metadata={"record_id": record.id}))
                elif other.record_hash != record.record_hash:
                    raise _indexed(index, total, AlreadyExists(
                        f"record {record.id} is already stored with other fields (record_hash "
                        f"{other.record_hash[:16]}…, the import has {record.record_hash[:16]}…)",
                        reason="RECORD_CONFLICT", metadata={"record_id": record.id}))
            # In creation order, so a run's snapshot (in storage order) reads as it did there.
            ordered = sorted(fresh.values(), key=lambda r: (r.created_us, r.id))
            if any(r.format == 1 for r in ordered):  # later writes must look for derived ids
                self._fleet_secrets.pop(fleet, None)
            self.repo.insert(session, ordered)
            self._import_compactions(session, fleet, ordered)
        return ordered

    def _import_compactions(self, session: Session, fleet: str,
                            imported: Sequence[Record]) -> None:
        """A compaction summary (source ``compactor``) names, under its record_hash, the
        originals it replaced: they leave search here as they did at the origin."""
        for summary in imported:
            if summary.source != SUMMARY_SOURCE or "replaces" not in summary.metadata:
                continue
            try:
                replaced = {str(item["id"]): str(item["record_hash"])
                            for item in json.loads(summary.metadata["replaces"])}
            except (ValueError, TypeError, KeyError):
                raise InvalidArgument(f"summary record {summary.id} has a replaces list that is "
                                      "not [{id, record_hash}, ...]", reason="IMPORT_NOT_NORMAL",
                                      metadata={"record_id": summary.id}) from None
            # Only records of this fleet (stored, or earlier in this import) are marked: a
            # summary naming another fleet's records must not hide them from search there or
            # hand them to this fleet's retention. One removed at the origin is not here.
            mine = self.repo.by_ids(session, fleet, sorted(replaced))
            for rid, stored in mine.items():
                if stored.record_hash != replaced[rid]:
                    raise InvalidArgument(
                        f"summary record {summary.id} replaces record {rid} with record_hash "
                        f"{replaced[rid][:16]}…, but it is stored with {stored.record_hash[:16]}"
                        "…; nothing was imported", reason="IMPORT_NOT_NORMAL",
                        metadata={"record_id": summary.id})
            done = self.repo.compacted_among(session, sorted(mine))
            originals = [mine[rid] for rid in sorted(mine) if rid not in done]
            if originals:
                self.repo.mark_compacted(session, fleet, summary.id, originals,
                                         summary.created_us)

    def _check_import(self, record: Record, fleet: str, known: set[str]) -> None:
        if not records.is_record_id(record.id):
            raise InvalidArgument(f"record id {record.id[:40]!r} is not a record id "
                                  f"({records.ID_HEX_LEN} lowercase hexadecimal characters)",
                                  reason="INVALID_RECORD_ID")
        if not 0 < record.created_us <= _LATEST_CREATED_US:
            raise InvalidArgument(f"record {record.id} has create time {record.created_us} µs, "
                                  "outside 1970..9999", reason="INVALID_CREATE_TIME",
                                  metadata={"record_id": record.id})
        if record.fleet_id != fleet:
            raise PermissionDenied(
                f"record {record.id} belongs to fleet {record.fleet_id!r}; this token imports "
                f"into fleet {fleet!r} only", reason="FLEET_MISMATCH")
        # before verify, which reads any format but 2 as 1
        if record.format not in (1, records.FORMAT):
            raise InvalidArgument(f"record {record.id} has format {record.format}; this "
                                  f"service stores 1 and {records.FORMAT}",
                                  reason="UNKNOWN_RECORD_FORMAT", metadata={"record_id": record.id})
        try:
            records.verify(record)
        except IntegrityError as error:
            raise InvalidArgument(f"{error.message}; nothing was imported",
                                  reason=error.reason, metadata=error.metadata) from None
        draft = RecordDraft(content=record.content, run_id=record.run_id, domain=record.domain,
                            source=record.source, importance=record.importance,
                            tags=record.tags, metadata=record.metadata)
        normal = records.normalize_draft(draft, self.limits)
        if normal != replace(draft, domain=record.domain.strip().lower()):
            raise InvalidArgument(f"record {record.id} is not in the form this service stores "
                                  "(content NFC, tags sorted and unique, source set)",
                                  reason="IMPORT_NOT_NORMAL", metadata={"record_id": record.id})
        if record.domain not in known:
            raise InvalidArgument(
                f"record {record.id} is in domain {record.domain!r}, unknown here; import the "
                "bundle's domains first (UpsertDomain)", reason="UNKNOWN_DOMAIN",
                metadata={"record_id": record.id})
        validate_identifier("agent_id", record.agent_id)
        # Fields stored as given and bounded by their columns: past them Postgres failed the
        # import INTERNAL and SQLite stored them (found by review on 2026-11-30).
        if record.gate_decision_id and not (len(record.gate_decision_id) <= _DECISION_ID_CHARS
                                            and is_identifier(record.gate_decision_id)):
            raise InvalidArgument(f"record {record.id} has gate decision id "
                                  f"{record.gate_decision_id[:80]!r}, which no gate decision has",
                                  reason="INVALID_DECISION_ID", metadata={"record_id": record.id})
        crossrefs.check_count(list(record.cross_refs))
        for ref in map(crossrefs.CrossRef.parse, record.cross_refs):
            if ref.kind not in ("domain", "record") or not ref.target or (
                    ref.kind == "domain" and ref.target not in known) or (
                    ref.kind == "record" and not records.is_record_id(ref.target)):
                raise InvalidArgument(f"record {record.id} has cross-reference {ref!r}, which "
                                      "names no known domain or a record",
                                      reason="CROSS_REFERENCE_TARGET_NOT_FOUND",
                                      metadata={"record_id": record.id})

    # -- reads --------------------------------------------------------------

    def get(self, principal: Principal, record_id: str) -> Record:
        record_id = validate_identifier("id", record_id.strip())
        with self.db.session() as session:
            found = self.repo.get(session, principal.fleet_id, record_id)
            erased = (self.repo.tombstone(session, principal.fleet_id, record_id)
                      if found is None else None)
        if erased is not None:
            raise NotFound(f"record {record_id!r} was erased (erasure {erased.erasure_id})",
                           reason="RECORD_ERASED",
                           metadata={"record_id": record_id, "erasure_id": erased.erasure_id})
        if found is None:
            raise NotFound(f"no record {record_id!r} in fleet {principal.fleet_id}",
                           reason="RECORD_NOT_FOUND", metadata={"record_id": record_id})
        return found

    def check_filter(self, run_id: str | None, agent_id: str, tags: Sequence[str]) -> None:
        """A list or search filter's ids are identifiers, and its tags within the limits."""
        if run_id:
            records.validate_run_id(run_id)
        if agent_id:
            validate_identifier("agent_id", agent_id)
        records.check_tags("the filter's tags", tuple(tags), self.limits.tags_per_filter,
                           "ENGRAM_LIMITS_TAGS_PER_FILTER", self.limits)

    def list_records(self, flt: RecordFilter, before_seq: int | None,
                     limit: int) -> RecordPage:
        self.check_filter(flt.run_id, flt.agent_id, flt.tags + flt.tags_any)
        with self.db.session() as session:
            return self.repo.page(session, flt, before_seq, limit)

    def search(self, query: SearchQuery) -> list[SearchHit]:
        check_limit("the query", len(query.text.encode()), self.limits.query_bytes,
                    "ENGRAM_LIMITS_QUERY_BYTES", "bytes")
        self.check_filter(query.run_id, "", query.tags + query.tags_any)
        return self.search_engine.search(query)

    # -- integrity ----------------------------------------------------------

    def verify(self, principal: Principal, ids: Sequence[str], everything: bool,
               active: Callable[[], bool] = lambda: True,
               erasures: ErasureSource | None = None) -> VerifyReport:
        """Re-hash the records named (or every record of the fleet) and check their
        tombstones: each re-derives its leaf, has a tombstone's form and is listed by the
        erasure it names, as governance (``erasures``) recorded it for the fleet."""
        if not ids and not everything:
            raise InvalidArgument("name record ids to verify, or ask for all",
                                  reason="NOTHING_TO_VERIFY")
        lookup = ErasureLookup(erasures, principal.fleet_id, log,
                               recorded=self.recorded_erasures)
        if everything:
            with self.whole_fleet_checks.slot("verifying every record of the fleet"):
                return self._verify(principal, ids, everything, active, lookup)
        return self._verify(principal, ids, everything, active, lookup)

    def _verify(self, principal: Principal, ids: Sequence[str], everything: bool,
                active: Callable[[], bool], lookup: ErasureLookup) -> VerifyReport:
        check_limit("ids to verify", len(ids), self.limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS", "ids")
        for record_id in ids:
            validate_identifier("id", record_id)
        failures: list[EngramError] = []
        sound: list[records.Tombstone] = []
        named: Iterable[records.Tombstone] = ()
        with self.db.session() as session:
            # A row that no longer parses is one more failure; the rest are still checked.
            source: Iterator[Record | IntegrityError]
            if everything:
                source = self.repo.scan_checked(session, RecordFilter(principal.fleet_id))
            else:
                found = self.repo.by_ids_checked(session, principal.fleet_id, list(ids))
                erased = {i: t for i in ids if i not in found
                          and (t := self.repo.tombstone(session, principal.fleet_id, i))}
                missing = [i for i in ids if i not in found and i not in erased]
                if missing:
                    raise NotFound(f"no record {missing[0]!r} in fleet {principal.fleet_id}",
                                   reason="RECORD_NOT_FOUND", metadata={"record_id": missing[0]})
                source = iter(found[i] for i in dict.fromkeys(ids) if i in found)
                named = erased.values()
            checked = self._check_records(source, failures, active)
            tombstoned = self._check_tombstones(named, failures, sound)
        # Governance is asked with no database session open.
        unconfirmed = self._audit_tombstones(sound, lookup, failures, active)
        if everything:  # the fleet's tombstones, a chunk at a time
            after: int | None = 0
            while after is not None:
                sound = []
                with self.db.session() as session:
                    chunk = self.repo.tombstones_after(session, principal.fleet_id, after,
                                                       AUDIT_CHUNK)
                    tombstoned += self._check_tombstones((t for _, t in chunk), failures,
                                                         sound)
                after = chunk[-1][0] if len(chunk) == AUDIT_CHUNK else None
                unconfirmed += self._audit_tombstones(sound, lookup, failures, active)
        lookup.report_unconfirmed(unconfirmed)
        return self._reported(VerifyReport(checked, failures, tombstoned, unconfirmed))

    def verify_page(self, principal: Principal, after: Sequence[Any] | None, limit: int,
                    active: Callable[[], bool] = lambda: True,
                    erasures: ErasureSource | None = None
                    ) -> tuple[VerifyReport, list[Any] | None]:
        """One page of the fleet's verification: at most ``limit`` records after the position
        ``after`` (``["records", seq]``; ``None`` to start), then its tombstones
        (``["tombstones", seq]``, each checked against its erasure as :meth:`verify` does,
        governance asked once per erasure id of the page), in one pass of bounded work; the
        position to go on from, or None after the last."""
        phase, position = (after[0], after[1]) if after else ("records", 0)
        if phase not in ("records", "tombstones") or not isinstance(position, int):
            raise InvalidArgument("page_token does not name a place in a verification",
                                  reason="INVALID_PAGE_TOKEN")
        failures: list[EngramError] = []
        sound: list[records.Tombstone] = []
        checked = tombstoned = 0
        following: list[Any] | None = None
        with self.db.session() as session:
            if phase == "records":
                rows = self.repo.checked_after(session, principal.fleet_id, position, limit)
                checked = self._check_records((r for _, r in rows), failures, active)
                if len(rows) == limit:
                    following = ["records", rows[-1][0]]
                phase, position = "tombstones", 0
            left = limit - checked
            if following is None and left > 0:
                erased = self.repo.tombstones_after(session, principal.fleet_id, position, left)
                tombstoned = self._check_tombstones((t for _, t in erased), failures, sound)
                if len(erased) == left:
                    following = ["tombstones", erased[-1][0]]
            elif following is None:  # the records filled the page: the tombstones are next
                following = ["tombstones", 0]
        lookup = ErasureLookup(erasures, principal.fleet_id, log,
                               recorded=self.recorded_erasures)
        unconfirmed = self._audit_tombstones(sound, lookup, failures, active)
        lookup.report_unconfirmed(unconfirmed)
        return (self._reported(VerifyReport(checked, failures, tombstoned, unconfirmed)),
                following)

    @staticmethod
    def _check_records(source: Iterable[Record | IntegrityError], failures: list[EngramError],
                       active: Callable[[], bool]) -> int:
        checked = 0
        for record in source:
            checked += 1
            if checked % 1000 == 0:
                still_wanted(active)
            if isinstance(record, IntegrityError):
                failures.append(record)
                continue
            try:
                records.verify(record)
            except EngramError as failure:
                failures.append(failure)
        return checked

    @staticmethod
    def _check_tombstones(tombstones: Iterable[records.Tombstone],
                          failures: list[EngramError],
                          sound: list[records.Tombstone] | None = None) -> int:
        """Each tombstone's form: its kept fields re-derive its leaf, it names an erasure id
        of governance's form and an erase time. Those that pass go to ``sound`` (for
        :meth:`_audit_tombstones`); the count checked is returned."""
        tombstoned = 0
        for tombstone in tombstones:
            tombstoned += 1
            if not records.verify_tombstone(tombstone):
                failures.append(IntegrityError(
                    f"record {tombstone.id} (erased by {tombstone.erasure_id}): its "
                    "tombstone's fields no longer derive its record_hash",
                    reason="TOMBSTONE_HASH_MISMATCH",
                    metadata={"record_id": tombstone.id, "expected": tombstone.record_hash,
                              "erasure_id": tombstone.erasure_id}))
            elif not is_erasure_id(tombstone.erasure_id) or tombstone.erased_us <= 0:
                failures.append(IntegrityError(
                    f"record {tombstone.id}: its tombstone names no erasure id governance "
                    f"issues ({tombstone.erasure_id[:80]!r}) or no erase time",
                    reason="INVALID_TOMBSTONE",
                    metadata={"record_id": tombstone.id, "erasure_id": tombstone.erasure_id}))
            elif sound is not None:
                sound.append(tombstone)
        return tombstoned

    @staticmethod
    def _audit_tombstones(tombstones: Sequence[records.Tombstone], lookup: ErasureLookup,
                          failures: list[EngramError], active: Callable[[], bool]) -> int:
        """Each tombstone (of a tombstone's form) against the erasure it names, as governance
        recorded it for the fleet: listed as a record or summary under the record_hash it
        kept, else TOMBSTONE_NOT_IN_ERASURE (erased by no erasure: content removed in the
        database, a tombstone forged). Grouped by erasure, so each is asked about once here
        (``lookup`` caches it for the rest of the call); the number left unconfirmed
        (governance could not be asked) is returned."""
        by_erasure: dict[str, list[records.Tombstone]] = {}
        for tombstone in tombstones:
            by_erasure.setdefault(tombstone.erasure_id, []).append(tombstone)
        unconfirmed = 0
        for erasure_id, erased in by_erasure.items():
            still_wanted(active)
            for tombstone in erased:
                listed = lookup.lists(erasure_id, ERASED_KINDS, tombstone.id,
                                      tombstone.record_hash)
                if listed is None:
                    unconfirmed += 1
                elif not listed:
                    failures.append(IntegrityError(
                        f"record {tombstone.id}: its tombstone names erasure {erasure_id}, "
                        "which as governance recorded it for this fleet does not list the "
                        f"record under its record_hash {tombstone.record_hash[:16]}… (erased "
                        "by no erasure)", reason=NOT_IN_ERASURE,
                        metadata={"record_id": tombstone.id, "expected": tombstone.record_hash,
                                  "erasure_id": erasure_id}))
        return unconfirmed

    def _reported(self, report: VerifyReport) -> VerifyReport:
        for found_bad in report.failures:
            self.integrity_failures.add(found_bad.reason)
        return report

    def snapshot(self, principal: Principal, run_id: str, verify: bool) -> Iterator[Record]:
        """Exactly the records of one run, oldest first; a tampered one raises DATA_LOSS.

        One short session a page, closed before the page is yielded: a slow reader holds no
        database connection, so slow readers cannot drain the pool and stall every write.
        """
        if run_id:
            records.validate_run_id(run_id)
        flt, after = RecordFilter(principal.fleet_id, run_id=run_id), 0
        while True:
            with self.db.session() as session:
                page = self.repo.oldest_after(session, flt, after, SNAPSHOT_PAGE)
            for _seq, record in page:
                if verify:
                    try:
                        records.verify(record)
                    except EngramError as failure:
                        self.integrity_failures.add(failure.reason)
                        raise
                yield record
            if len(page) < SNAPSHOT_PAGE:
                return
            after = page[-1][0]

    # -- status -------------------------------------------------------------

    def status(self, principal: Principal) -> FleetStatus:
        domains = self.domains(principal.fleet_id, fresh=True)
        with self.db.session() as session:
            total, runs, links = self.repo.counts(session, principal.fleet_id)
            incoming = self.repo.incoming_domain_links(session, principal.fleet_id)
        return FleetStatus(principal.fleet_id, total, runs, links, domains, incoming,
                           self.search_engine.indexing_lag(principal.fleet_id),
                           self.search_engine.embedding_model(),
                           self.search_engine.previous_embedding_model())

    def summary(self, principal: Principal) -> dict[str, object]:
        """The seed's global summary (section 2.4.3)."""
        status = self.status(principal)
        domains, incoming = status.domains, status.incoming
        return {
            "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock())),
            "fleet_id": principal.fleet_id,
            "total_shards": len(domains),
            "total_transactions": status.total_records,
            "domains_count": len(domains),
            "shards_status": [
                {"shard_id": f"shard_{d.name}", "domain": d.name, "name": d.display_name,
                 "description": d.description, "keywords": list(d.keywords),
                 "transactions": d.record_count, "importance_score": round(d.importance, 4),
                 "incoming_links": incoming.get(d.name, 0),
                 "last_updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.updated_ts))
                 if d.updated_ts else None}
                for d in domains
            ],
        }


def _answered_by(record_id: str, duplicate_of: dict[str, Record | str]) -> str:
    """The id of the record answering the input prepared as ``record_id``."""
    original = duplicate_of.get(record_id)
    if original is None:
        return record_id
    return original if isinstance(original, str) else original.id


def _digest(drafts: Sequence[RecordDraft]) -> str:
    body = [[d.content, d.run_id, d.domain, d.source, d.importance, list(d.tags),
             sorted(d.metadata.items())] for d in drafts]
    return hashlib.sha256(json.dumps(body, ensure_ascii=False).encode()).hexdigest()


def _request_id_reused(request_id: str) -> InvalidArgument:
    return InvalidArgument(f"request_id {request_id!r} was already used for different records; "
                           "use a new request_id for a new write", reason="REQUEST_ID_REUSED")


def _gate_key(request_id: str, digest: str, fresh: Sequence[Record]) -> str:
    """``request_id`` bound to the request's body and to this attempt's record ids and
    commitments (an identifier within governance's 128 characters: ``:`` joins them); empty
    without one (the gate then mints a fresh key).

    A format-2 record's id and salt are random, so an attempt that reached governance but
    was never stored (the shard restarted, governance's answer was lost) is not replayed
    for the client's retry: the retry is judged afresh under its own ids, and the first
    decision stays in the chain for a write that never landed."""
    if not request_id:
        return ""
    attempt = hashlib.sha256("\x1f".join(
        [digest, *(f"{r.id}:{records.gate_hash(r)}" for r in fresh)]).encode()).hexdigest()
    return f"{request_id[:100]}:{attempt[:24]}"


def _indexed(index: int, total: int, error: EngramError) -> EngramError:
    if total > 1:
        error.message = f"record {index}: {error.message}"
        error.args = (error.message,)
        error.metadata.setdefault("index", str(index))
    return error


def _at_index(index: int, total: int, fn: Callable[[T], R], value: T) -> R:
    try:
        return fn(value)
    except EngramError as error:
        raise _indexed(index, total, error) from None

