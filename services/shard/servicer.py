"""gRPC edge of the shard: protos in, domain calls, protos out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from engram.shard.v1 import shard_service_pb2 as pb
from engram.shard.v1 import shard_service_pb2_grpc as pb_grpc
from services.common.admission import READ, WRITE, MethodKinds
from services.common.auth import (
    COMPACTOR_SERVICE,
    MethodPolicy,
    current_principal,
    is_caller,
    target_fleet,
)
from services.common.pagination import paginate
from services.common.tokens import Principal
from services.shard.compaction import MemoryCompactor
from services.shard.domain.domains import Domain
from services.shard.domain.records import DEFAULT_IMPORTANCE, Record, RecordDraft
from services.shard.repository import RecordFilter
from services.shard.search.engine import SearchQuery
from services.shard.service import ShardService, WriteResult

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ShardService"].full_name
_WRITERS = frozenset({"agent", "admin"})
_READERS = frozenset({"agent", "admin", "governor"})


def _m(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


POLICY: MethodPolicy = {
    _m("CreateRecord"): _WRITERS,
    _m("BatchCreateRecords"): _WRITERS,
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
}
assert set(POLICY) == {_m(m.name) for m in pb.DESCRIPTOR.services_by_name["ShardService"].methods}
KINDS: MethodKinds = {  # which rate limit each RPC counts against
    **{_m(name): WRITE for name in (
        "CreateRecord", "BatchCreateRecords", "UpsertDomain", "CompactRecords", "ApplyRetention")},
    **{_m(name): READ for name in (
        "GetRecord", "ListRecords", "SearchRecords", "ListDomains", "VerifyRecords",
        "SnapshotForRun", "GetStatus", "ExportSummary")},
}
assert set(KINDS) == set(POLICY)

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


class ShardServicer(pb_grpc.ShardServiceServicer):
    def __init__(self, service: ShardService, compactor: MemoryCompactor) -> None:
        self.service = service
        self.compactor = compactor

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

    def GetRecord(self, request: pb.GetRecordRequest, context: Any) -> pb.GetRecordResponse:
        return pb.GetRecordResponse(
            record=record_to_proto(self.service.get(current_principal(), request.id))
        )

    def ListRecords(self, request: pb.ListRecordsRequest, context: Any) -> pb.ListRecordsResponse:
        principal = current_principal()
        flt = RecordFilter(
            principal.fleet_id,
            run_id=request.run_id if request.HasField("run_id") else None,
            domain=request.domain.strip().lower(),
            agent_id=request.agent_id,
            tags=tuple(sorted(set(request.tags))),
        )
        filters = {
            "run": flt.run_id,
            "domain": flt.domain,
            "agent": flt.agent_id,
            "tags": list(flt.tags),
            "fleet": flt.fleet_id,
        }
        rows, next_token = paginate(
            request.page_token, request.page_size, filters,
            lambda after, limit: self.service.list_records(
                flt, int(after[0]) if after else None, limit),
            lambda row: [row[0]],
        )
        return pb.ListRecordsResponse(
            records=[record_to_proto(r) for _, r in rows], next_page_token=next_token
        )

    def SearchRecords(
        self, request: pb.SearchRecordsRequest, context: Any
    ) -> pb.SearchRecordsResponse:
        hits = self.service.search(
            SearchQuery(
                fleet_id=current_principal().fleet_id,
                text=request.query,
                limit=request.limit or 10,
                run_id=request.run_id if request.HasField("run_id") else None,
                domain=request.domain.strip().lower(),
                cross=request.cross,
                mode=_MODES.get(request.mode, "hybrid"),
                tags=tuple(request.tags),
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
        page, next_token = paginate(
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
        report = self.service.verify(current_principal(), list(request.ids), request.all)
        return pb.VerifyRecordsResponse(
            checked=report.checked,
            failures=[
                pb.IntegrityFailure(
                    id=f.metadata.get("record_id", ""),
                    expected_hash=f.metadata.get("expected", ""),
                    actual_hash=f.metadata.get("actual", ""),
                    detail=f.message,
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


def add_to_server(servicer: ShardServicer, server: grpc.Server) -> None:
    pb_grpc.add_ShardServiceServicer_to_server(servicer, server)
