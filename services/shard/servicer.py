"""gRPC edge of the shard: protos in, domain calls, protos out."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from engram.shard.v1 import shard_service_pb2 as pb
from engram.shard.v1 import shard_service_pb2_grpc as pb_grpc
from services.common.admission import READ, WRITE, MethodKinds, RecordCounts
from services.common.auth import (
    COMPACTOR_SERVICE,
    MethodPolicy,
    current_principal,
    is_caller,
    target_fleet,
)
from services.common.errors import InvalidArgument, PermissionDenied
from services.common.pagination import PageTokens
from services.common.timestamps import time_us
from services.common.tokens import Principal
from services.shard.compaction import MemoryCompactor
from services.shard.domain.domains import Domain
from services.shard.domain.records import DEFAULT_IMPORTANCE, Record, RecordDraft, Tombstone
from services.shard.erasure import Forgotten, RecordEraser
from services.shard.repository import RecordFilter
from services.shard.search.engine import SearchQuery
from services.shard.service import ShardService, WriteResult
from services.shard.tombstones import TombstoneImports

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ShardService"].full_name
_WRITERS = frozenset({"agent", "admin"})
_READERS = frozenset({"agent", "admin", "governor"})


def _m(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


POLICY: MethodPolicy = {
    _m("CreateRecord"): _WRITERS,
    _m("BatchCreateRecords"): _WRITERS,
    # records exported elsewhere, kept as they were (their gate decision included): admin only
    _m("ImportRecords"): frozenset({"admin"}),
    _m("GetRecord"): _READERS,
    _m("ListRecords"): _READERS,
    _m("SearchRecords"): _READERS,
    _m("ListDomains"): _READERS,
    _m("UpsertDomain"): frozenset({"admin"}),
    _m("VerifyRecords"): _READERS,
    _m("SnapshotForRun"): _READERS,
    _m("GetStatus"): _READERS,
    _m("ExportSummary"): _READERS,
    # the compactor runs them for the fleets whose memory policy asked; an admin for its own
    _m("CompactRecords"): frozenset({COMPACTOR_SERVICE, "admin"}),
    _m("ApplyRetention"): frozenset({COMPACTOR_SERVICE, "admin"}),
    # erasure is a governance act: the people who may record one may carry it out
    _m("ForgetRecords"): frozenset({"governor", "admin"}),
    _m("ListTombstones"): frozenset({"governor", "admin"}),
    # tombstones kept elsewhere, each listed by an erasure governance holds: admin only
    _m("ImportTombstones"): frozenset({"admin"}),
}
assert set(POLICY) == {_m(m.name) for m in pb.DESCRIPTOR.services_by_name["ShardService"].methods}
KINDS: MethodKinds = {  # which rate limit each RPC counts against
    **{_m(name): WRITE for name in (
        "CreateRecord", "BatchCreateRecords", "ImportRecords", "UpsertDomain", "CompactRecords",
        "ApplyRetention", "ForgetRecords", "ImportTombstones")},
    **{_m(name): READ for name in (
        "GetRecord", "ListRecords", "SearchRecords", "ListDomains", "VerifyRecords",
        "SnapshotForRun", "GetStatus", "ExportSummary", "ListTombstones")},
}
assert set(KINDS) == set(POLICY)
RECORDS: RecordCounts = {  # the records each call writes, against ENGRAM_SHARD_RATE_LIMIT_RECORDS
    _m("CreateRecord"): lambda request: 1,
    _m("BatchCreateRecords"): lambda request: len(request.records),
}  # not ImportRecords: the admin's restore of a bundle (engram import-bundle) goes at disk speed

_MODES = {
    pb.SEARCH_MODE_UNSPECIFIED: "hybrid",
    pb.SEARCH_MODE_LEXICAL: "lexical",
    pb.SEARCH_MODE_SEMANTIC: "semantic",
    pb.SEARCH_MODE_HYBRID: "hybrid",
}


def record_to_proto(record: Record) -> pb.Record:
    created = Timestamp()
    created.FromMicroseconds(record.created_us)
    return pb.Record(
        id=record.id,
        fleet_id=record.fleet_id,
        run_id=record.run_id,
        agent_id=record.agent_id,
        content=record.content,
        content_hash=record.content_hash,
        domain=record.domain,
        source=record.source,
        importance=record.importance,
        tags=list(record.tags),
        cross_refs=list(record.cross_refs),
        create_time=created,
        metadata=record.metadata,
        record_hash=record.record_hash,
        gate_decision_id=record.gate_decision_id,
        format=record.format,
        salt=record.salt,
        body_commitment=record.body_commitment,
    )


def domain_to_proto(domain: Domain, incoming: int = 0) -> pb.Domain:
    updated = Timestamp()
    updated.FromMicroseconds(int(domain.updated_ts * 1_000_000))
    return pb.Domain(
        name=domain.name,
        display_name=domain.display_name,
        description=domain.description,
        keywords=list(domain.keywords),
        importance=domain.importance,
        record_count=domain.record_count,
        update_time=updated,
        incoming_links=incoming,
    )


def draft_from_proto(message: pb.RecordInput) -> RecordDraft:
    return RecordDraft(
        content=message.content,
        run_id=message.run_id,
        domain=message.domain,
        source=message.source,
        importance=message.importance if message.HasField("importance") else DEFAULT_IMPORTANCE,
        tags=tuple(message.tags),
        metadata=dict(message.metadata),
    )


def record_from_proto(message: pb.Record) -> Record:
    """A record as GetRecord returned it elsewhere, to import (checked by the service)."""
    return Record(
        id=message.id, fleet_id=message.fleet_id, run_id=message.run_id,
        agent_id=message.agent_id, content=message.content, content_hash=message.content_hash,
        record_hash=message.record_hash, domain=message.domain, source=message.source,
        importance=message.importance, tags=tuple(message.tags),
        metadata=dict(message.metadata), cross_refs=tuple(message.cross_refs),
        created_us=time_us(message.create_time, f"record {message.id[:40]!r}'s create_time",
                           reason="INVALID_CREATE_TIME"),
        gate_decision_id=message.gate_decision_id,
        format=message.format or 1, salt=message.salt, body_commitment=message.body_commitment,
    )


def tombstone_to_proto(tombstone: Tombstone) -> pb.RecordTombstone:
    created, erased = Timestamp(), Timestamp()
    created.FromMicroseconds(tombstone.created_us)
    erased.FromMicroseconds(tombstone.erased_us)
    return pb.RecordTombstone(
        id=tombstone.id, fleet_id=tombstone.fleet_id, run_id=tombstone.run_id,
        agent_id=tombstone.agent_id, format=tombstone.format,
        body_commitment=tombstone.body_commitment, record_hash=tombstone.record_hash,
        domain=tombstone.domain, source=tombstone.source, importance=tombstone.importance,
        cross_refs=list(tombstone.cross_refs), create_time=created,
        gate_decision_id=tombstone.gate_decision_id, erasure_id=tombstone.erasure_id,
        erase_time=erased, erased_by=tombstone.erased_by)


def tombstone_from_proto(message: pb.RecordTombstone) -> Tombstone:
    """A tombstone as ListTombstones returned it elsewhere, to import (checked on import)."""
    return Tombstone(
        id=message.id, fleet_id=message.fleet_id, run_id=message.run_id,
        agent_id=message.agent_id, format=message.format,
        body_commitment=message.body_commitment, record_hash=message.record_hash,
        domain=message.domain, source=message.source, importance=message.importance,
        cross_refs=tuple(message.cross_refs),
        created_us=time_us(message.create_time, "create_time", reason="INVALID_TOMBSTONE"),
        gate_decision_id=message.gate_decision_id, erasure_id=message.erasure_id,
        erased_us=time_us(message.erase_time, "erase_time", reason="INVALID_TOMBSTONE"),
        erased_by=message.erased_by)


def _result(result: WriteResult) -> pb.CreateRecordResponse:
    return pb.CreateRecordResponse(
        record=record_to_proto(result.record),
        created=result.created,
        duplicate_of=result.duplicate_of,
    )


def _fleet_acted_on(principal: Principal, requested: str) -> str:
    """The compactor's principal names the fleet it acts on; others act on their own."""
    compactor = is_caller(principal, COMPACTOR_SERVICE)
    return target_fleet(principal, requested, cross_fleet=compactor, name_required=compactor)


@dataclass(frozen=True)
class FilterLimits:
    """Bounds on one RecordFilter (ENGRAM_SHARD_FILTER_MAX_METADATA); its tags are bounded by
    ENGRAM_LIMITS_TAGS_PER_FILTER with every other list's."""

    max_metadata: int = 16


def _one(legacy: str | None, filtered: str | None, name: str) -> str | None:
    """A condition given both as a request field and in ``filter``: they must agree."""
    if legacy is not None and filtered is not None and legacy != filtered:
        raise InvalidArgument(f"{name} differs between the request and its filter",
                              reason="CONFLICTING_FILTER")
    return legacy if legacy is not None else filtered


def record_filter(fleet_id: str, flt: pb.RecordFilter, limits: FilterLimits, *,
                  run_id: str | None, domain: str, agent_id: str,
                  tags: Sequence[str], exclude_compacted: bool = False) -> RecordFilter:
    """The request's conditions (its own fields and ``filter``), checked; never the fleet's
    choice: ``fleet_id`` is the caller's."""
    if len(flt.metadata) > limits.max_metadata:
        raise InvalidArgument(
            f"filter has {len(flt.metadata)} metadata pairs; at most {limits.max_metadata}",
            reason="FILTER_TOO_LARGE", metadata={"limit": str(limits.max_metadata)})
    all_tags = sorted(set(tags) | set(flt.tags_all))  # counted by ENGRAM_LIMITS_TAGS_PER_FILTER
    any_tags = sorted(set(flt.tags_any))
    for key in flt.metadata:
        if not key or '"' in key or "\\" in key:
            raise InvalidArgument(f"metadata key {key!r} cannot be filtered on",
                                  reason="INVALID_METADATA_KEY")
    minimum: float | None = None
    if flt.HasField("min_importance"):
        minimum = flt.min_importance
        if not 0.0 <= minimum <= 1.0:  # NaN fails too
            raise InvalidArgument(f"min_importance must be 0..1, got {minimum}",
                                  reason="INVALID_IMPORTANCE")
    after = time_us(flt.created_after, "created_after") if flt.HasField("created_after") else None
    before = (time_us(flt.created_before, "created_before")
              if flt.HasField("created_before") else None)
    if after is not None and before is not None and after >= before:
        raise InvalidArgument("created_after must be earlier than created_before",
                              reason="INVALID_TIME_RANGE")
    run = _one(run_id, flt.run_id if flt.HasField("run_id") else None, "run_id")
    dom = _one(domain or None, flt.domain.strip().lower() or None, "domain") or ""
    author = _one(agent_id or None, flt.agent_id or None, "agent_id") or ""
    return RecordFilter(
        fleet_id, run_id=run, domain=dom, agent_id=author, tags=tuple(all_tags),
        exclude_compacted=exclude_compacted, tags_any=tuple(any_tags),
        metadata=tuple(sorted(flt.metadata.items())), created_after_us=after,
        created_before_us=before, min_importance=minimum)


class ShardServicer(pb_grpc.ShardServiceServicer):
    def __init__(self, service: ShardService, compactor: MemoryCompactor,
                 pages: PageTokens | None = None,
                 filter_limits: FilterLimits | None = None,
                 eraser: RecordEraser | None = None) -> None:
        self.service = service
        self.compactor = compactor
        self.eraser = eraser or RecordEraser(service, None)
        self.tombstones = TombstoneImports(service, self.eraser.source)
        self.pages = pages or PageTokens.ephemeral()
        self.filter_limits = filter_limits or FilterLimits()

    def CreateRecord(
        self, request: pb.CreateRecordRequest, context: Any
    ) -> pb.CreateRecordResponse:
        results = self.service.write(
            current_principal(), [draft_from_proto(request.record)], request.request_id
        )
        return _result(results[0])

    def BatchCreateRecords(
        self, request: pb.BatchCreateRecordsRequest, context: Any
    ) -> pb.BatchCreateRecordsResponse:
        results = self.service.write(
            current_principal(), [draft_from_proto(r) for r in request.records], request.request_id
        )
        return pb.BatchCreateRecordsResponse(results=[_result(r) for r in results])

    def ImportRecords(
        self, request: pb.ImportRecordsRequest, context: Any
    ) -> pb.ImportRecordsResponse:
        created, present = self.service.import_records(
            current_principal(), [record_from_proto(r) for r in request.records])
        return pb.ImportRecordsResponse(created=created, already_present=present)

    def GetRecord(self, request: pb.GetRecordRequest, context: Any) -> pb.GetRecordResponse:
        return pb.GetRecordResponse(
            record=record_to_proto(self.service.get(current_principal(), request.id))
        )

    def ListRecords(self, request: pb.ListRecordsRequest, context: Any) -> pb.ListRecordsResponse:
        principal = current_principal()
        flt = record_filter(
            principal.fleet_id, request.filter, self.filter_limits,
            run_id=request.run_id if request.HasField("run_id") else None,
            domain=request.domain.strip().lower(),
            agent_id=request.agent_id,
            tags=request.tags,
        )
        # The page token binds every condition: reusing it with another filter is refused.
        filters = {
            "run": flt.run_id,
            "domain": flt.domain,
            "agent": flt.agent_id,
            "tags": list(flt.tags),
            "fleet": flt.fleet_id,
            "tags_any": list(flt.tags_any),
            "metadata": [list(pair) for pair in flt.metadata],
            "after": flt.created_after_us,
            "before": flt.created_before_us,
            "min_importance": flt.min_importance,
        }
        # One row past the page tells whether another follows. A page whose examined rows ran
        # out first (a filter few records match: see ShardRepository.page) may be short, or
        # empty, and still name the next: the client follows tokens until there is none.
        after = self.pages.decode(request.page_token, filters)
        size = self.pages.page_size(request.page_size)
        found = self.service.list_records(flt, int(after[0]) if after else None, size + 1)
        rows = found.rows[:size]
        if len(found.rows) > size:
            next_token = self.pages.encode([rows[-1][0]], filters)
        elif found.resume_before is not None:
            next_token = self.pages.encode([found.resume_before], filters)
        else:
            next_token = ""
        return pb.ListRecordsResponse(
            records=[record_to_proto(r) for _, r in rows], next_page_token=next_token
        )

    def SearchRecords(
        self, request: pb.SearchRecordsRequest, context: Any
    ) -> pb.SearchRecordsResponse:
        flt = record_filter(
            current_principal().fleet_id, request.filter, self.filter_limits,
            run_id=request.run_id if request.HasField("run_id") else None,
            domain=request.domain.strip().lower(), agent_id="", tags=request.tags,
        )
        hits = self.service.search(
            SearchQuery(
                fleet_id=flt.fleet_id,
                text=request.query,
                limit=request.limit or 10,
                run_id=flt.run_id,
                domain=flt.domain,
                cross=request.cross,
                mode=_MODES.get(request.mode, "hybrid"),
                tags=flt.tags,
                tags_any=flt.tags_any,
                metadata=flt.metadata,
                agent_id=flt.agent_id,
                created_after_us=flt.created_after_us,
                created_before_us=flt.created_before_us,
                min_importance=flt.min_importance,
            )
        )
        return pb.SearchRecordsResponse(
            hits=[
                pb.SearchHit(record=record_to_proto(h.record), score=h.score, via=h.via)
                for h in hits
            ]
        )

    def ListDomains(self, request: pb.ListDomainsRequest, context: Any) -> pb.ListDomainsResponse:
        principal = current_principal()
        status = self.service.status(principal)
        incoming = status.incoming
        domains = sorted(status.domains, key=lambda d: d.name)
        page, next_token = self.pages.paginate(
            request.page_token, request.page_size, {"fleet": principal.fleet_id},
            lambda after, limit: [d for d in domains
                                  if after is None or d.name > str(after[0])][:limit],
            lambda domain: [domain.name],
        )
        return pb.ListDomainsResponse(
            domains=[domain_to_proto(d, incoming.get(d.name, 0)) for d in page],
            next_page_token=next_token,
        )

    def UpsertDomain(
        self, request: pb.UpsertDomainRequest, context: Any
    ) -> pb.UpsertDomainResponse:
        domain, created = self.service.upsert_domain(
            current_principal(),
            request.name,
            request.display_name,
            request.description,
            list(request.keywords),
        )
        return pb.UpsertDomainResponse(domain=domain_to_proto(domain), created=created)

    def VerifyRecords(
        self, request: pb.VerifyRecordsRequest, context: Any
    ) -> pb.VerifyRecordsResponse:
        principal, next_token = current_principal(), ""
        if request.page_size or request.page_token:
            if request.ids or not request.all:
                raise InvalidArgument("page_size and page_token page a verification of every "
                                      "record (all = true), not of named ids",
                                      reason="PAGING_WITH_IDS")
            filters = {"verify": "all"}
            after = self.pages.decode(request.page_token, filters)
            report, following = self.service.verify_page(
                principal, after, self.pages.page_size(request.page_size), context.is_active,
                self.eraser.source)
            next_token = self.pages.encode(following, filters) if following else ""
        else:
            if request.all and not (
                    is_caller(principal, "governor") or is_caller(principal, "admin")):
                raise PermissionDenied(
                    "verifying the whole fleet in one call is for the governor and admin roles "
                    "(it re-hashes every record at once); verify it a page at a time: set "
                    "page_size and follow next_page_token (engram verify --all does)",
                    reason="ROLE_REQUIRED", metadata={"required_roles": "admin,governor"})
            report = self.service.verify(principal, list(request.ids), request.all,
                                         context.is_active, self.eraser.source)
        return pb.VerifyRecordsResponse(
            checked=report.checked, tombstoned=report.tombstoned, next_page_token=next_token,
            tombstones_unconfirmed=report.unconfirmed,
            failures=[
                pb.IntegrityFailure(
                    id=f.metadata.get("record_id", ""),
                    expected_hash=f.metadata.get("expected", ""),
                    actual_hash=f.metadata.get("actual", ""),
                    detail=f.message,
                    reason=f.reason,
                    erasure_id=f.metadata.get("erasure_id", ""),
                )
                for f in report.failures
            ],
        )

    def SnapshotForRun(
        self, request: pb.SnapshotForRunRequest, context: Any
    ) -> Iterator[pb.SnapshotForRunResponse]:
        verify = request.verify if request.HasField("verify") else True
        for record in self.service.snapshot(current_principal(), request.run_id, verify):
            yield pb.SnapshotForRunResponse(record=record_to_proto(record))

    def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        status = self.service.status(current_principal())
        return pb.GetStatusResponse(
            fleet_id=status.fleet_id,
            total_records=status.total_records,
            domains=[domain_to_proto(d, status.incoming.get(d.name, 0)) for d in status.domains],
            total_links=status.total_links,
            runs=status.runs,
            indexing_lag=status.indexing_lag,
            embedding_model=status.embedding_model,
            previous_embedding_model=status.previous_embedding_model,
        )

    def ExportSummary(
        self, request: pb.ExportSummaryRequest, context: Any
    ) -> pb.ExportSummaryResponse:
        return pb.ExportSummaryResponse(
            summary_json=json.dumps(self.service.summary(current_principal()), indent=2)
        )

    def CompactRecords(
        self, request: pb.CompactRecordsRequest, context: Any
    ) -> pb.CompactRecordsResponse:
        fleet = _fleet_acted_on(current_principal(), request.fleet_id)
        report = self.compactor.compact(
            fleet,
            importance_below=request.importance_below
            if request.HasField("importance_below")
            else 0.3,
            older_than_days=request.older_than_days
            if request.HasField("older_than_days")
            else 30.0,
            dry_run=request.dry_run,
        )
        return pb.CompactRecordsResponse(
            examined=report.examined,
            compacted=report.compacted,
            groups=[
                pb.CompactionGroup(
                    summary=record_to_proto(g.summary) if g.summary else None,
                    replaced_ids=list(g.replaced_ids),
                    replaced_hashes=list(g.replaced_hashes),
                    domain=g.domain,
                    run_id=g.run_id,
                )
                for g in report.groups
            ],
        )

    def ApplyRetention(
        self, request: pb.ApplyRetentionRequest, context: Any
    ) -> pb.ApplyRetentionResponse:
        fleet = _fleet_acted_on(current_principal(), request.fleet_id)
        removed = self.compactor.apply_retention(fleet, request.older_than_days, request.dry_run)
        return pb.ApplyRetentionResponse(removed_ids=removed)

    def ForgetRecords(
        self, request: pb.ForgetRecordsRequest, context: Any
    ) -> pb.ForgetRecordsResponse:
        principal = current_principal()
        fleet = target_fleet(principal, request.fleet_id)
        if request.erasure_id:
            if request.WhichOneof("selector") is not None or request.page_token:
                raise InvalidArgument("give erasure_id alone: the erasure lists what goes",
                                      reason="INVALID_SELECTOR")
            erased = self.eraser.erase(principal, fleet, request.erasure_id)
            return pb.ForgetRecordsResponse(records=_forgotten(erased.items),
                                            erasure_id=request.erasure_id,
                                            already_erased=erased.already)
        which = request.WhichOneof("selector")
        kind, value = _SELECTORS.get(which or "", ""), getattr(request, which) if which else ""
        filters = {"forget": kind, "value": value, "fleet": fleet}
        after = self.pages.decode(request.page_token, filters)
        if after is not None and not (len(after) == 1 and isinstance(after[0], int)):
            raise InvalidArgument("the page token does not name a place in a selection",
                                  reason="INVALID_PAGE_TOKEN")
        selection = self.eraser.select(fleet, kind, value, request.limit, context.is_active,
                                       after[0] if after else 0)
        return pb.ForgetRecordsResponse(
            records=_forgotten(selection.items), more=selection.more,
            next_page_token=(self.pages.encode([selection.following], filters)
                             if selection.following is not None else ""))

    def ListTombstones(
        self, request: pb.ListTombstonesRequest, context: Any
    ) -> pb.ListTombstonesResponse:
        fleet = current_principal().fleet_id
        found, token = self.pages.paginate(
            request.page_token, request.page_size, {"fleet": fleet, "list": "tombstones"},
            lambda after, limit: self.tombstones.page(fleet, str(after[0]) if after else None,
                                                      limit),
            lambda tombstone: [tombstone.id])
        return pb.ListTombstonesResponse(tombstones=[tombstone_to_proto(t) for t in found],
                                         next_page_token=token)

    def ImportTombstones(
        self, request: pb.ImportTombstonesRequest, context: Any
    ) -> pb.ImportTombstonesResponse:
        created, present = self.tombstones.import_tombstones(
            current_principal(), [tombstone_from_proto(t) for t in request.tombstones])
        return pb.ImportTombstonesResponse(created=created, already_present=present)


_SELECTORS = {"agent_id": "agent", "record_id": "record", "run_id": "run", "match": "match"}


def _forgotten(items: list[Forgotten]) -> list[pb.ForgottenRecord]:
    return [pb.ForgottenRecord(record_id=i.record_id, record_hash=i.record_hash, kind=i.kind,
                               format=i.format) for i in items]


def add_to_server(servicer: ShardServicer, server: grpc.Server) -> None:
    pb_grpc.add_ShardServiceServicer_to_server(servicer, server)
