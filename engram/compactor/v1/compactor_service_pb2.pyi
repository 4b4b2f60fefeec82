import datetime

from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DetailSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DETAIL_SOURCE_UNSPECIFIED: _ClassVar[DetailSource]
    DETAIL_SOURCE_HOT: _ClassVar[DetailSource]
    DETAIL_SOURCE_COLD_SNAPSHOT: _ClassVar[DetailSource]
    DETAIL_SOURCE_BASE_SNAPSHOT: _ClassVar[DetailSource]
    DETAIL_SOURCE_SUMMARY_ONLY: _ClassVar[DetailSource]

class PolicyKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_KIND_UNSPECIFIED: _ClassVar[PolicyKind]
    POLICY_KIND_COMPACT: _ClassVar[PolicyKind]
    POLICY_KIND_RETENTION: _ClassVar[PolicyKind]
DETAIL_SOURCE_UNSPECIFIED: DetailSource
DETAIL_SOURCE_HOT: DetailSource
DETAIL_SOURCE_COLD_SNAPSHOT: DetailSource
DETAIL_SOURCE_BASE_SNAPSHOT: DetailSource
DETAIL_SOURCE_SUMMARY_ONLY: DetailSource
POLICY_KIND_UNSPECIFIED: PolicyKind
POLICY_KIND_COMPACT: PolicyKind
POLICY_KIND_RETENTION: PolicyKind

class IterationSummary(_message.Message):
    __slots__ = ("iteration", "plan_digest", "parent_digest", "start_time", "end_time", "files_touched", "net_add", "net_del", "risk_score", "status", "detail_digest", "prev_hash", "hash", "format", "salt", "summary_commitment", "erasure_id", "erase_time", "erased_by")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PARENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    FILES_TOUCHED_FIELD_NUMBER: _ClassVar[int]
    NET_ADD_FIELD_NUMBER: _ClassVar[int]
    NET_DEL_FIELD_NUMBER: _ClassVar[int]
    RISK_SCORE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    ERASE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERASED_BY_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    plan_digest: str
    parent_digest: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    files_touched: int
    net_add: int
    net_del: int
    risk_score: float
    status: str
    detail_digest: str
    prev_hash: str
    hash: str
    format: int
    salt: str
    summary_commitment: str
    erasure_id: str
    erase_time: _timestamp_pb2.Timestamp
    erased_by: str
    def __init__(self, iteration: _Optional[int] = ..., plan_digest: _Optional[str] = ..., parent_digest: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., files_touched: _Optional[int] = ..., net_add: _Optional[int] = ..., net_del: _Optional[int] = ..., risk_score: _Optional[float] = ..., status: _Optional[str] = ..., detail_digest: _Optional[str] = ..., prev_hash: _Optional[str] = ..., hash: _Optional[str] = ..., format: _Optional[int] = ..., salt: _Optional[str] = ..., summary_commitment: _Optional[str] = ..., erasure_id: _Optional[str] = ..., erase_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., erased_by: _Optional[str] = ...) -> None: ...

class IterationInput(_message.Message):
    __slots__ = ("iteration", "plan_digest", "parent_digest", "start_time", "end_time", "files_touched", "net_add", "net_del", "risk_score", "status", "detail_json", "guardrails_json")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PARENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    FILES_TOUCHED_FIELD_NUMBER: _ClassVar[int]
    NET_ADD_FIELD_NUMBER: _ClassVar[int]
    NET_DEL_FIELD_NUMBER: _ClassVar[int]
    RISK_SCORE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    GUARDRAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    plan_digest: str
    parent_digest: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    files_touched: int
    net_add: int
    net_del: int
    risk_score: float
    status: str
    detail_json: str
    guardrails_json: str
    def __init__(self, iteration: _Optional[int] = ..., plan_digest: _Optional[str] = ..., parent_digest: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., files_touched: _Optional[int] = ..., net_add: _Optional[int] = ..., net_del: _Optional[int] = ..., risk_score: _Optional[float] = ..., status: _Optional[str] = ..., detail_json: _Optional[str] = ..., guardrails_json: _Optional[str] = ...) -> None: ...

class RecordIterationRequest(_message.Message):
    __slots__ = ("run_id", "iteration", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: IterationInput
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[_Union[IterationInput, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RecordIterationResponse(_message.Message):
    __slots__ = ("summary", "created")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    summary: IterationSummary
    created: bool
    def __init__(self, summary: _Optional[_Union[IterationSummary, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class HotIteration(_message.Message):
    __slots__ = ("summary", "detail_json", "guardrails_json")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    GUARDRAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    summary: IterationSummary
    detail_json: str
    guardrails_json: str
    def __init__(self, summary: _Optional[_Union[IterationSummary, _Mapping]] = ..., detail_json: _Optional[str] = ..., guardrails_json: _Optional[str] = ...) -> None: ...

class ListRecentIterationsRequest(_message.Message):
    __slots__ = ("run_id", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRecentIterationsResponse(_message.Message):
    __slots__ = ("iterations", "next_page_token")
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    iterations: _containers.RepeatedCompositeFieldContainer[HotIteration]
    next_page_token: str
    def __init__(self, iterations: _Optional[_Iterable[_Union[HotIteration, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListSummariesRequest(_message.Message):
    __slots__ = ("run_id", "start_iteration", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    START_ITERATION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    start_iteration: int
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., start_iteration: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSummariesResponse(_message.Message):
    __slots__ = ("summaries", "next_page_token")
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    summaries: _containers.RepeatedCompositeFieldContainer[IterationSummary]
    next_page_token: str
    def __init__(self, summaries: _Optional[_Iterable[_Union[IterationSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReconstructIterationRequest(_message.Message):
    __slots__ = ("run_id", "iteration")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ...) -> None: ...

class ReconstructIterationResponse(_message.Message):
    __slots__ = ("summary", "source", "detail_json", "guardrails_json", "base_iteration", "trail")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    GUARDRAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    BASE_ITERATION_FIELD_NUMBER: _ClassVar[int]
    TRAIL_FIELD_NUMBER: _ClassVar[int]
    summary: IterationSummary
    source: DetailSource
    detail_json: str
    guardrails_json: str
    base_iteration: int
    trail: _containers.RepeatedCompositeFieldContainer[IterationSummary]
    def __init__(self, summary: _Optional[_Union[IterationSummary, _Mapping]] = ..., source: _Optional[_Union[DetailSource, str]] = ..., detail_json: _Optional[str] = ..., guardrails_json: _Optional[str] = ..., base_iteration: _Optional[int] = ..., trail: _Optional[_Iterable[_Union[IterationSummary, _Mapping]]] = ...) -> None: ...

class Pin(_message.Message):
    __slots__ = ("iteration", "reason", "snapshot_iteration", "create_time")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ITERATION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    reason: str
    snapshot_iteration: int
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, iteration: _Optional[int] = ..., reason: _Optional[str] = ..., snapshot_iteration: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PinIterationRequest(_message.Message):
    __slots__ = ("run_id", "iteration", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PinIterationResponse(_message.Message):
    __slots__ = ("pin",)
    PIN_FIELD_NUMBER: _ClassVar[int]
    pin: Pin
    def __init__(self, pin: _Optional[_Union[Pin, _Mapping]] = ...) -> None: ...

class VerifyRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class VerifyProblem(_message.Message):
    __slots__ = ("location", "detail")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    location: str
    detail: str
    def __init__(self, location: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class VerifyRunResponse(_message.Message):
    __slots__ = ("ok", "lines_checked", "segments_checked", "snapshots_checked", "last_iteration", "head_hash", "problems", "tombstoned", "tombstones_unconfirmed", "erased", "erasure_id")
    OK_FIELD_NUMBER: _ClassVar[int]
    LINES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    LAST_ITERATION_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONED_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    ERASED_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    lines_checked: int
    segments_checked: int
    snapshots_checked: int
    last_iteration: int
    head_hash: str
    problems: _containers.RepeatedCompositeFieldContainer[VerifyProblem]
    tombstoned: int
    tombstones_unconfirmed: int
    erased: bool
    erasure_id: str
    def __init__(self, ok: _Optional[bool] = ..., lines_checked: _Optional[int] = ..., segments_checked: _Optional[int] = ..., snapshots_checked: _Optional[int] = ..., last_iteration: _Optional[int] = ..., head_hash: _Optional[str] = ..., problems: _Optional[_Iterable[_Union[VerifyProblem, _Mapping]]] = ..., tombstoned: _Optional[int] = ..., tombstones_unconfirmed: _Optional[int] = ..., erased: _Optional[bool] = ..., erasure_id: _Optional[str] = ...) -> None: ...

class FindIterationLogsRequest(_message.Message):
    __slots__ = ("match", "limit", "page_token")
    MATCH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    match: str
    limit: int
    page_token: str
    def __init__(self, match: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class FoundIterationLog(_message.Message):
    __slots__ = ("run_id", "head_hash", "last_iteration", "iterations", "whole_log_needed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    LAST_ITERATION_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    WHOLE_LOG_NEEDED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    head_hash: str
    last_iteration: int
    iterations: _containers.RepeatedCompositeFieldContainer[FoundIteration]
    whole_log_needed: bool
    def __init__(self, run_id: _Optional[str] = ..., head_hash: _Optional[str] = ..., last_iteration: _Optional[int] = ..., iterations: _Optional[_Iterable[_Union[FoundIteration, _Mapping]]] = ..., whole_log_needed: _Optional[bool] = ...) -> None: ...

class FoundIteration(_message.Message):
    __slots__ = ("iteration", "leaf_hash", "format")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    LEAF_HASH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    leaf_hash: str
    format: int
    def __init__(self, iteration: _Optional[int] = ..., leaf_hash: _Optional[str] = ..., format: _Optional[int] = ...) -> None: ...

class FindIterationLogsResponse(_message.Message):
    __slots__ = ("runs", "more", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[FoundIterationLog]
    more: bool
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[FoundIterationLog, _Mapping]]] = ..., more: _Optional[bool] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ForgetIterationsRequest(_message.Message):
    __slots__ = ("erasure_id",)
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    erasure_id: str
    def __init__(self, erasure_id: _Optional[str] = ...) -> None: ...

class ForgottenIterations(_message.Message):
    __slots__ = ("run_id", "last_iteration", "head_hash", "blobs")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ITERATION_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    last_iteration: int
    head_hash: str
    blobs: int
    def __init__(self, run_id: _Optional[str] = ..., last_iteration: _Optional[int] = ..., head_hash: _Optional[str] = ..., blobs: _Optional[int] = ...) -> None: ...

class ForgetIterationsResponse(_message.Message):
    __slots__ = ("runs", "already_erased", "iterations_erased")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_ERASED_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_ERASED_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[ForgottenIterations]
    already_erased: int
    iterations_erased: int
    def __init__(self, runs: _Optional[_Iterable[_Union[ForgottenIterations, _Mapping]]] = ..., already_erased: _Optional[int] = ..., iterations_erased: _Optional[int] = ...) -> None: ...

class CompactedGroup(_message.Message):
    __slots__ = ("summary_id", "replaced_ids", "replaced_hashes", "domain", "run_id")
    SUMMARY_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACED_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLACED_HASHES_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    summary_id: str
    replaced_ids: _containers.RepeatedScalarFieldContainer[str]
    replaced_hashes: _containers.RepeatedScalarFieldContainer[str]
    domain: str
    run_id: str
    def __init__(self, summary_id: _Optional[str] = ..., replaced_ids: _Optional[_Iterable[str]] = ..., replaced_hashes: _Optional[_Iterable[str]] = ..., domain: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class PolicyRun(_message.Message):
    __slots__ = ("id", "fleet_id", "kind", "dry_run", "trigger", "outcome", "error", "examined", "compacted", "groups", "removed_ids", "importance_below", "older_than_days", "start_time", "end_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXAMINED_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_IDS_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_BELOW_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_DAYS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    fleet_id: str
    kind: PolicyKind
    dry_run: bool
    trigger: str
    outcome: str
    error: str
    examined: int
    compacted: int
    groups: _containers.RepeatedCompositeFieldContainer[CompactedGroup]
    removed_ids: _containers.RepeatedScalarFieldContainer[str]
    importance_below: float
    older_than_days: float
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., kind: _Optional[_Union[PolicyKind, str]] = ..., dry_run: _Optional[bool] = ..., trigger: _Optional[str] = ..., outcome: _Optional[str] = ..., error: _Optional[str] = ..., examined: _Optional[int] = ..., compacted: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[CompactedGroup, _Mapping]]] = ..., removed_ids: _Optional[_Iterable[str]] = ..., importance_below: _Optional[float] = ..., older_than_days: _Optional[float] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CompactMemoryRequest(_message.Message):
    __slots__ = ("fleet_id", "dry_run", "importance_below", "older_than_days")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_BELOW_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_DAYS_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    dry_run: bool
    importance_below: float
    older_than_days: float
    def __init__(self, fleet_id: _Optional[str] = ..., dry_run: _Optional[bool] = ..., importance_below: _Optional[float] = ..., older_than_days: _Optional[float] = ...) -> None: ...

class CompactMemoryResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: PolicyRun
    def __init__(self, run: _Optional[_Union[PolicyRun, _Mapping]] = ...) -> None: ...

class ApplyMemoryRetentionRequest(_message.Message):
    __slots__ = ("fleet_id", "older_than_days", "dry_run")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_DAYS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    older_than_days: float
    dry_run: bool
    def __init__(self, fleet_id: _Optional[str] = ..., older_than_days: _Optional[float] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ApplyMemoryRetentionResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: PolicyRun
    def __init__(self, run: _Optional[_Union[PolicyRun, _Mapping]] = ...) -> None: ...

class ListPolicyRunsRequest(_message.Message):
    __slots__ = ("fleet_id", "page_size", "page_token")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    page_size: int
    page_token: str
    def __init__(self, fleet_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPolicyRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[PolicyRun]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[PolicyRun, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ImportedIteration(_message.Message):
    __slots__ = ("summary", "detail_json", "guardrails_json")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    GUARDRAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    summary: IterationSummary
    detail_json: str
    guardrails_json: str
    def __init__(self, summary: _Optional[_Union[IterationSummary, _Mapping]] = ..., detail_json: _Optional[str] = ..., guardrails_json: _Optional[str] = ...) -> None: ...

class ImportIterationsRequest(_message.Message):
    __slots__ = ("run_id", "iterations")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iterations: _containers.RepeatedCompositeFieldContainer[ImportedIteration]
    def __init__(self, run_id: _Optional[str] = ..., iterations: _Optional[_Iterable[_Union[ImportedIteration, _Mapping]]] = ...) -> None: ...

class ImportIterationsResponse(_message.Message):
    __slots__ = ("created", "already_present")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    created: int
    already_present: int
    def __init__(self, created: _Optional[int] = ..., already_present: _Optional[int] = ...) -> None: ...
