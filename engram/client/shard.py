"""Python SDK for the shard service."""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from engram.client._channel import BaseClient, idempotency_key, string_list
from engram.shard.v1 import shard_service_pb2 as pb
from engram.shard.v1 import shard_service_pb2_grpc as pb_grpc

MODES = {
    "lexical": pb.SEARCH_MODE_LEXICAL,
    "semantic": pb.SEARCH_MODE_SEMANTIC,
    "hybrid": pb.SEARCH_MODE_HYBRID,
}

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
VERIFY_PAGE = 1000
"""Records a paged verification asks re-hashed a call (the service's page limit, by default)."""
_CONDITION = re.compile(r"([^=!<>~]*)(==|!=|<=|>=|=~|=|<|>|~)(.*)", re.DOTALL)


def parse_time(value: str | datetime, name: str = "time") -> Timestamp:
    """An RFC 3339 instant ("2026-05-01T12:00:00Z", an offset, not a bare date) or an aware
    datetime, as a Timestamp; anything else is a ValueError naming ``name``."""
    if isinstance(value, datetime):
        moment = value
    else:
        text = str(value).strip()
        if not _RFC3339.fullmatch(text):
            raise ValueError(f"{name}: {value!r} is not an RFC 3339 time "
                             "(e.g. 2026-05-01T12:00:00Z)")
        fraction = re.search(r"\.(\d+)", text)
        if fraction:  # Python reads at most microseconds
            text = text.replace(fraction.group(0), "." + fraction.group(1)[:6].ljust(6, "0"))
        try:
            moment = datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
        except ValueError as error:
            raise ValueError(f"{name}: {value!r} is not an RFC 3339 time ({error})") from None
    if moment.tzinfo is None:
        raise ValueError(f"{name}: {value!r} has no time zone offset")
    stamp = Timestamp()
    stamp.FromMicroseconds((moment - _EPOCH) // timedelta(microseconds=1))
    return stamp


def parse_condition(text: str) -> tuple[str, str]:
    """``key=value`` (the only operator) -> (key, value); another operator is a ValueError."""
    found = _CONDITION.fullmatch(text)
    if found is None:
        raise ValueError(f"metadata condition {text!r} must read key=value")
    key, operator, value = found.groups()
    if operator != "=":
        raise ValueError(f"unknown operator {operator!r} in {text!r}; only key=value is supported")
    if not key.strip():
        raise ValueError(f"metadata condition {text!r} names no key")
    return key.strip(), value


def record_filter(
    *,
    metadata: Mapping[str, str] | None = None,
    tags_any: Sequence[str] = (),
    tags_all: Sequence[str] = (),
    author: str = "",
    created_after: str | datetime | None = None,
    created_before: str | datetime | None = None,
    min_importance: float | None = None,
    run_id: str | None = None,
    domain: str = "",
) -> pb.RecordFilter:
    """Conditions for :meth:`ShardClient.search` and :meth:`ShardClient.list`, all of which
    must hold. Times are RFC 3339 strings or aware datetimes; a malformed one, or an
    importance outside 0..1, is a ValueError raised before anything is sent."""
    flt = pb.RecordFilter(
        metadata=dict(metadata or {}),
        tags_any=string_list("tags_any", tags_any),
        tags_all=string_list("tags_all", tags_all),
        agent_id=author,
        domain=domain,
    )
    if created_after is not None:
        flt.created_after.CopyFrom(parse_time(created_after, "created_after"))
    if created_before is not None:
        flt.created_before.CopyFrom(parse_time(created_before, "created_before"))
    if min_importance is not None:
        if not 0.0 <= min_importance <= 1.0:
            raise ValueError(f"min_importance must be 0..1, got {min_importance}")
        flt.min_importance = min_importance
    if run_id is not None:
        flt.run_id = run_id
    return flt


def record_input(
    content: str,
    *,
    run_id: str = "",
    domain: str = "",
    source: str = "",
    importance: float | None = None,
    tags: Sequence[str] = (),
    metadata: Mapping[str, str] | None = None,
) -> pb.RecordInput:
    """One record to store. A value of the wrong type is a TypeError naming its parameter,
    raised before anything is sent."""
    fields: dict[str, Any] = {
        "content": content,
        "run_id": run_id,
        "domain": domain,
        "source": source,
        "tags": string_list("tags", tags),
        "metadata": metadata or {},
    }
    if importance is not None:
        fields["importance"] = importance
    try:
        return pb.RecordInput(**fields)
    except (TypeError, ValueError):
        for name, value in fields.items():
            try:
                pb.RecordInput(**{name: value})
            except (TypeError, ValueError) as error:
                raise TypeError(f"{name}={value!r} is not accepted: {error}") from None
        raise


class ShardClient(BaseClient):
    """``ShardClient(target, token)``; every method raises ``EngramRpcError`` on failure."""

    @cached_property
    def stub(self) -> pb_grpc.ShardServiceStub:
        return pb_grpc.ShardServiceStub(self.channel)

    def add(
        self,
        content: str,
        *,
        run_id: str = "",
        domain: str = "",
        source: str = "",
        importance: float | None = None,
        tags: Sequence[str] = (),
        metadata: Mapping[str, str] | None = None,
        request_id: str = "",
    ) -> pb.CreateRecordResponse:
        """Store one record; ``request_id`` makes a retry return the first result."""
        record = record_input(content, run_id=run_id, domain=domain, source=source,
                              importance=importance, tags=tags, metadata=metadata)
        request = pb.CreateRecordRequest(record=record, request_id=idempotency_key(request_id))
        return self.call(self.stub.CreateRecord, request)

    def add_many(
        self, records: Iterable[pb.RecordInput], request_id: str = ""
    ) -> pb.BatchCreateRecordsResponse:
        request = pb.BatchCreateRecordsRequest(records=list(records),
                                               request_id=idempotency_key(request_id))
        return self.call(self.stub.BatchCreateRecords, request)

    def import_records(self, records: Iterable[pb.Record]) -> pb.ImportRecordsResponse:
        """Store records exported elsewhere as they were (admin role); all or nothing."""
        return self.call(self.stub.ImportRecords,
                         pb.ImportRecordsRequest(records=list(records)))

    def tombstones(self, *, page_size: int = 0) -> Iterator[pb.RecordTombstone]:
        """The fleet's erased records' tombstones, by id, following page tokens."""
        return self.paginate(self.stub.ListTombstones,
                             pb.ListTombstonesRequest(page_size=page_size),
                             lambda reply: reply.tombstones)

    def import_tombstones(self, tombstones: Iterable[pb.RecordTombstone]
                          ) -> pb.ImportTombstonesResponse:
        """Keep tombstones another instance kept (admin role; import-bundle); all or nothing."""
        reply: pb.ImportTombstonesResponse = self.call(
            self.stub.ImportTombstones, pb.ImportTombstonesRequest(tombstones=list(tombstones)))
        return reply

    def get(self, record_id: str) -> pb.Record:
        return self.call(self.stub.GetRecord, pb.GetRecordRequest(id=record_id)).record

    def list(
        self,
        *,
        run_id: str | None = None,
        tags: Sequence[str] = (),
        domain: str = "",
        agent_id: str = "",
        page_size: int = 0,
        tags_any: Sequence[str] = (),
        metadata: Mapping[str, str] | None = None,
        created_after: str | datetime | None = None,
        created_before: str | datetime | None = None,
        min_importance: float | None = None,
    ) -> Iterator[pb.Record]:
        """Every matching record, newest first, following page tokens. ``tags``: all of
        them; ``tags_any``: one at least; ``metadata``: every key = value; times are RFC 3339
        (see :func:`record_filter`)."""
        request = pb.ListRecordsRequest(
            tags=string_list("tags", tags), domain=domain, agent_id=agent_id, page_size=page_size,
            filter=record_filter(metadata=metadata, tags_any=tags_any,
                                 created_after=created_after, created_before=created_before,
                                 min_importance=min_importance),
        )
        if run_id is not None:
            request.run_id = run_id
        return self.paginate(self.stub.ListRecords, request, lambda reply: reply.records)

    def search(
        self,
        query: str,
        *,
        limit: int = 10,
        run_id: str | None = None,
        domain: str = "",
        cross: bool = False,
        mode: str = "hybrid",
        tags: Sequence[str] = (),
        tags_any: Sequence[str] = (),
        metadata: Mapping[str, str] | None = None,
        author: str = "",
        created_after: str | datetime | None = None,
        created_before: str | datetime | None = None,
        min_importance: float | None = None,
    ) -> builtins.list[pb.SearchHit]:
        """The best ``limit`` records for ``query``; ``mode`` is lexical, semantic or hybrid.
        The filters (``tags``: all of them; ``tags_any``; ``metadata`` key = value pairs;
        ``author``; RFC 3339 ``created_after`` / ``created_before``; ``min_importance``) apply
        before ranking: the hits are the best ``limit`` among the matching records."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        request = pb.SearchRecordsRequest(
            query=query,
            limit=limit,
            domain=domain,
            cross=cross,
            mode=MODES[mode],
            tags=string_list("tags", tags),
            filter=record_filter(metadata=metadata, tags_any=tags_any, author=author,
                                 created_after=created_after, created_before=created_before,
                                 min_importance=min_importance),
        )
        if run_id is not None:
            request.run_id = run_id
        return list(self.call(self.stub.SearchRecords, request).hits)

    def domains(self) -> builtins.list[pb.Domain]:
        """Every domain of the caller's fleet."""
        request = pb.ListDomainsRequest(page_size=1000)
        return list(self.paginate(self.stub.ListDomains, request, lambda reply: reply.domains))

    def upsert_domain(
        self,
        name: str,
        *,
        display_name: str = "",
        description: str = "",
        keywords: Sequence[str] = (),
    ) -> pb.UpsertDomainResponse:
        return self.call(
            self.stub.UpsertDomain,
            pb.UpsertDomainRequest(
                name=name,
                display_name=display_name,
                description=description,
                keywords=string_list("keywords", keywords),
            ),
        )

    def verify(
        self, ids: Sequence[str] = (), *, all_records: bool = False
    ) -> pb.VerifyRecordsResponse:
        """Re-hash the records named, or (``all_records``) every record and tombstone of the
        fleet, a page a call (:meth:`verify_pages`), summed into one report. Each tombstone is
        checked against the erasure it names (``tombstones_unconfirmed``: those governance
        could not be asked about)."""
        if not all_records:
            return self.call(self.stub.VerifyRecords,
                             pb.VerifyRecordsRequest(ids=string_list("ids", ids)))
        if ids:
            raise ValueError("verify names ids or all_records, not both")
        total = pb.VerifyRecordsResponse()
        for page in self.verify_pages():
            total.checked += page.checked
            total.tombstoned += page.tombstoned
            total.tombstones_unconfirmed += page.tombstones_unconfirmed
            total.failures.extend(page.failures)
        return total

    def verify_pages(self, page_size: int = VERIFY_PAGE) -> Iterator[pb.VerifyRecordsResponse]:
        """The fleet's verification a page at a time (records, then tombstones): each call
        re-hashes at most ``page_size`` (the service may lower it)."""
        token = ""
        while True:
            page = self.call(self.stub.VerifyRecords, pb.VerifyRecordsRequest(
                all=True, page_size=page_size, page_token=token))
            yield page
            token = page.next_page_token
            if not token:
                return

    def snapshot(self, run_id: str, *, verify: bool = True) -> Iterator[pb.Record]:
        request = pb.SnapshotForRunRequest(run_id=run_id, verify=verify)
        for response in self.stream(self.stub.SnapshotForRun, request):
            yield response.record

    def status(self) -> pb.GetStatusResponse:
        return self.call(self.stub.GetStatus, pb.GetStatusRequest())

    def summary(self) -> str:
        return self.call(self.stub.ExportSummary, pb.ExportSummaryRequest()).summary_json

    def compact(
        self,
        fleet_id: str = "",
        *,
        importance_below: float | None = None,
        older_than_days: float | None = None,
        dry_run: bool = False,
    ) -> pb.CompactRecordsResponse:
        request = pb.CompactRecordsRequest(fleet_id=fleet_id, dry_run=dry_run)
        if importance_below is not None:
            request.importance_below = importance_below
        if older_than_days is not None:
            request.older_than_days = older_than_days
        return self.call(self.stub.CompactRecords, request)

    def forget(self, *, agent_id: str = "", record_id: str = "", run_id: str = "",
               match: str = "", erasure_id: str = "", fleet_id: str = "",
               limit: int = 0, page_token: str = "") -> pb.ForgetRecordsResponse:
        """Without ``erasure_id``: a page of the records one selector matches (nothing
        changes; ``next_page_token`` lists the next). With it: erase what governance's
        erasure of that id lists (governor or admin role)."""
        request = pb.ForgetRecordsRequest(fleet_id=fleet_id, erasure_id=erasure_id,
                                          limit=limit, page_token=page_token)
        for name, value in (("agent_id", agent_id), ("record_id", record_id),
                            ("run_id", run_id), ("match", match)):
            if value:
                setattr(request, name, value)
        return self.call(self.stub.ForgetRecords, request)

    def apply_retention(
        self, fleet_id: str, older_than_days: float, dry_run: bool = False
    ) -> builtins.list[str]:
        request = pb.ApplyRetentionRequest(
            fleet_id=fleet_id, older_than_days=older_than_days, dry_run=dry_run
        )
        return list(self.call(self.stub.ApplyRetention, request).removed_ids)
