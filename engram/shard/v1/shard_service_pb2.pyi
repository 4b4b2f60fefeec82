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

class SearchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_MODE_UNSPECIFIED: _ClassVar[SearchMode]
    SEARCH_MODE_LEXICAL: _ClassVar[SearchMode]
    SEARCH_MODE_SEMANTIC: _ClassVar[SearchMode]
    SEARCH_MODE_HYBRID: _ClassVar[SearchMode]
SEARCH_MODE_UNSPECIFIED: SearchMode
SEARCH_MODE_LEXICAL: SearchMode
SEARCH_MODE_SEMANTIC: SearchMode
SEARCH_MODE_HYBRID: SearchMode

class RecordTombstone(_message.Message):
    __slots__ = ("id", "fleet_id", "run_id", "agent_id", "format", "body_commitment", "record_hash", "domain", "source", "importance", "cross_refs", "create_time", "gate_decision_id", "erasure_id", "erase_time", "erased_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    BODY_COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    RECORD_HASH_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    CROSS_REFS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    GATE_DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    ERASE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERASED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    fleet_id: str
    run_id: str
    agent_id: str
    format: int
    body_commitment: str
    record_hash: str
    domain: str
    source: str
    importance: float
    cross_refs: _containers.RepeatedScalarFieldContainer[str]
    create_time: _timestamp_pb2.Timestamp
    gate_decision_id: str
    erasure_id: str
    erase_time: _timestamp_pb2.Timestamp
    erased_by: str
    def __init__(self, id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., run_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., format: _Optional[int] = ..., body_commitment: _Optional[str] = ..., record_hash: _Optional[str] = ..., domain: _Optional[str] = ..., source: _Optional[str] = ..., importance: _Optional[float] = ..., cross_refs: _Optional[_Iterable[str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., gate_decision_id: _Optional[str] = ..., erasure_id: _Optional[str] = ..., erase_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., erased_by: _Optional[str] = ...) -> None: ...

class ListTombstonesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTombstonesResponse(_message.Message):
    __slots__ = ("tombstones", "next_page_token")
    TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tombstones: _containers.RepeatedCompositeFieldContainer[RecordTombstone]
    next_page_token: str
    def __init__(self, tombstones: _Optional[_Iterable[_Union[RecordTombstone, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ImportTombstonesRequest(_message.Message):
    __slots__ = ("tombstones",)
    TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    tombstones: _containers.RepeatedCompositeFieldContainer[RecordTombstone]
    def __init__(self, tombstones: _Optional[_Iterable[_Union[RecordTombstone, _Mapping]]] = ...) -> None: ...

class ImportTombstonesResponse(_message.Message):
    __slots__ = ("created", "already_present")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    created: int
    already_present: int
    def __init__(self, created: _Optional[int] = ..., already_present: _Optional[int] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("id", "fleet_id", "run_id", "agent_id", "content", "content_hash", "domain", "source", "importance", "tags", "cross_refs", "create_time", "metadata", "record_hash", "gate_decision_id", "format", "salt", "body_commitment")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    CROSS_REFS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RECORD_HASH_FIELD_NUMBER: _ClassVar[int]
    GATE_DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    BODY_COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    fleet_id: str
    run_id: str
    agent_id: str
    content: str
    content_hash: str
    domain: str
    source: str
    importance: float
    tags: _containers.RepeatedScalarFieldContainer[str]
    cross_refs: _containers.RepeatedScalarFieldContainer[str]
    create_time: _timestamp_pb2.Timestamp
    metadata: _containers.ScalarMap[str, str]
    record_hash: str
    gate_decision_id: str
    format: int
    salt: str
    body_commitment: str
    def __init__(self, id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., run_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., content: _Optional[str] = ..., content_hash: _Optional[str] = ..., domain: _Optional[str] = ..., source: _Optional[str] = ..., importance: _Optional[float] = ..., tags: _Optional[_Iterable[str]] = ..., cross_refs: _Optional[_Iterable[str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., record_hash: _Optional[str] = ..., gate_decision_id: _Optional[str] = ..., format: _Optional[int] = ..., salt: _Optional[str] = ..., body_commitment: _Optional[str] = ...) -> None: ...

class RecordInput(_message.Message):
    __slots__ = ("content", "run_id", "domain", "source", "importance", "tags", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    content: str
    run_id: str
    domain: str
    source: str
    importance: float
    tags: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, content: _Optional[str] = ..., run_id: _Optional[str] = ..., domain: _Optional[str] = ..., source: _Optional[str] = ..., importance: _Optional[float] = ..., tags: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateRecordRequest(_message.Message):
    __slots__ = ("record", "request_id")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    record: RecordInput
    request_id: str
    def __init__(self, record: _Optional[_Union[RecordInput, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateRecordResponse(_message.Message):
    __slots__ = ("record", "created", "duplicate_of")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_OF_FIELD_NUMBER: _ClassVar[int]
    record: Record
    created: bool
    duplicate_of: str
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ..., created: _Optional[bool] = ..., duplicate_of: _Optional[str] = ...) -> None: ...

class BatchCreateRecordsRequest(_message.Message):
    __slots__ = ("records", "request_id")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[RecordInput]
    request_id: str
    def __init__(self, records: _Optional[_Iterable[_Union[RecordInput, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class BatchCreateRecordsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CreateRecordResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[CreateRecordResponse, _Mapping]]] = ...) -> None: ...

class ImportRecordsRequest(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class ImportRecordsResponse(_message.Message):
    __slots__ = ("created", "already_present")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    created: int
    already_present: int
    def __init__(self, created: _Optional[int] = ..., already_present: _Optional[int] = ...) -> None: ...

class GetRecordRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetRecordResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: Record
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class ListRecordsRequest(_message.Message):
    __slots__ = ("run_id", "tags", "domain", "agent_id", "page_size", "page_token", "filter")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    domain: str
    agent_id: str
    page_size: int
    page_token: str
    filter: RecordFilter
    def __init__(self, run_id: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., domain: _Optional[str] = ..., agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[_Union[RecordFilter, _Mapping]] = ...) -> None: ...

class ListRecordsResponse(_message.Message):
    __slots__ = ("records", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RecordFilter(_message.Message):
    __slots__ = ("metadata", "tags_any", "tags_all", "agent_id", "created_after", "created_before", "min_importance", "run_id", "domain")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TAGS_ANY_FIELD_NUMBER: _ClassVar[int]
    TAGS_ALL_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MIN_IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    metadata: _containers.ScalarMap[str, str]
    tags_any: _containers.RepeatedScalarFieldContainer[str]
    tags_all: _containers.RepeatedScalarFieldContainer[str]
    agent_id: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    min_importance: float
    run_id: str
    domain: str
    def __init__(self, metadata: _Optional[_Mapping[str, str]] = ..., tags_any: _Optional[_Iterable[str]] = ..., tags_all: _Optional[_Iterable[str]] = ..., agent_id: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., min_importance: _Optional[float] = ..., run_id: _Optional[str] = ..., domain: _Optional[str] = ...) -> None: ...

class SearchRecordsRequest(_message.Message):
    __slots__ = ("query", "limit", "run_id", "domain", "cross", "mode", "tags", "filter")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    CROSS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    query: str
    limit: int
    run_id: str
    domain: str
    cross: bool
    mode: SearchMode
    tags: _containers.RepeatedScalarFieldContainer[str]
    filter: RecordFilter
    def __init__(self, query: _Optional[str] = ..., limit: _Optional[int] = ..., run_id: _Optional[str] = ..., domain: _Optional[str] = ..., cross: _Optional[bool] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., tags: _Optional[_Iterable[str]] = ..., filter: _Optional[_Union[RecordFilter, _Mapping]] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("record", "score", "via")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    record: Record
    score: float
    via: str
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ..., score: _Optional[float] = ..., via: _Optional[str] = ...) -> None: ...

class SearchRecordsResponse(_message.Message):
    __slots__ = ("hits",)
    HITS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ...) -> None: ...

class Domain(_message.Message):
    __slots__ = ("name", "display_name", "description", "keywords", "importance", "record_count", "update_time", "incoming_links")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    INCOMING_LINKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    display_name: str
    description: str
    keywords: _containers.RepeatedScalarFieldContainer[str]
    importance: float
    record_count: int
    update_time: _timestamp_pb2.Timestamp
    incoming_links: int
    def __init__(self, name: _Optional[str] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., keywords: _Optional[_Iterable[str]] = ..., importance: _Optional[float] = ..., record_count: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., incoming_links: _Optional[int] = ...) -> None: ...

class ListDomainsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDomainsResponse(_message.Message):
    __slots__ = ("domains", "next_page_token")
    DOMAINS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    domains: _containers.RepeatedCompositeFieldContainer[Domain]
    next_page_token: str
    def __init__(self, domains: _Optional[_Iterable[_Union[Domain, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpsertDomainRequest(_message.Message):
    __slots__ = ("name", "display_name", "description", "keywords")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    display_name: str
    description: str
    keywords: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., keywords: _Optional[_Iterable[str]] = ...) -> None: ...

class UpsertDomainResponse(_message.Message):
    __slots__ = ("domain", "created")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    domain: Domain
    created: bool
    def __init__(self, domain: _Optional[_Union[Domain, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class VerifyRecordsRequest(_message.Message):
    __slots__ = ("ids", "all", "page_size", "page_token")
    IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    page_size: int
    page_token: str
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class IntegrityFailure(_message.Message):
    __slots__ = ("id", "expected_hash", "actual_hash", "detail", "reason", "erasure_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HASH_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_HASH_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    expected_hash: str
    actual_hash: str
    detail: str
    reason: str
    erasure_id: str
    def __init__(self, id: _Optional[str] = ..., expected_hash: _Optional[str] = ..., actual_hash: _Optional[str] = ..., detail: _Optional[str] = ..., reason: _Optional[str] = ..., erasure_id: _Optional[str] = ...) -> None: ...

class VerifyRecordsResponse(_message.Message):
    __slots__ = ("checked", "failures", "tombstoned", "next_page_token", "tombstones_unconfirmed")
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    checked: int
    failures: _containers.RepeatedCompositeFieldContainer[IntegrityFailure]
    tombstoned: int
    next_page_token: str
    tombstones_unconfirmed: int
    def __init__(self, checked: _Optional[int] = ..., failures: _Optional[_Iterable[_Union[IntegrityFailure, _Mapping]]] = ..., tombstoned: _Optional[int] = ..., next_page_token: _Optional[str] = ..., tombstones_unconfirmed: _Optional[int] = ...) -> None: ...

class SnapshotForRunRequest(_message.Message):
    __slots__ = ("run_id", "verify")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    verify: bool
    def __init__(self, run_id: _Optional[str] = ..., verify: _Optional[bool] = ...) -> None: ...

class SnapshotForRunResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: Record
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("fleet_id", "total_records", "domains", "total_links", "runs", "indexing_lag", "embedding_model", "previous_embedding_model")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DOMAINS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LINKS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    INDEXING_LAG_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    total_records: int
    domains: _containers.RepeatedCompositeFieldContainer[Domain]
    total_links: int
    runs: int
    indexing_lag: int
    embedding_model: str
    previous_embedding_model: str
    def __init__(self, fleet_id: _Optional[str] = ..., total_records: _Optional[int] = ..., domains: _Optional[_Iterable[_Union[Domain, _Mapping]]] = ..., total_links: _Optional[int] = ..., runs: _Optional[int] = ..., indexing_lag: _Optional[int] = ..., embedding_model: _Optional[str] = ..., previous_embedding_model: _Optional[str] = ...) -> None: ...

class ExportSummaryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExportSummaryResponse(_message.Message):
    __slots__ = ("summary_json",)
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    summary_json: str
    def __init__(self, summary_json: _Optional[str] = ...) -> None: ...

class CompactRecordsRequest(_message.Message):
    __slots__ = ("fleet_id", "importance_below", "older_than_days", "dry_run")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_BELOW_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_DAYS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    importance_below: float
    older_than_days: float
    dry_run: bool
    def __init__(self, fleet_id: _Optional[str] = ..., importance_below: _Optional[float] = ..., older_than_days: _Optional[float] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CompactionGroup(_message.Message):
    __slots__ = ("summary", "replaced_ids", "replaced_hashes", "domain", "run_id")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    REPLACED_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLACED_HASHES_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    summary: Record
    replaced_ids: _containers.RepeatedScalarFieldContainer[str]
    replaced_hashes: _containers.RepeatedScalarFieldContainer[str]
    domain: str
    run_id: str
    def __init__(self, summary: _Optional[_Union[Record, _Mapping]] = ..., replaced_ids: _Optional[_Iterable[str]] = ..., replaced_hashes: _Optional[_Iterable[str]] = ..., domain: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class CompactRecordsResponse(_message.Message):
    __slots__ = ("groups", "examined", "compacted")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    EXAMINED_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[CompactionGroup]
    examined: int
    compacted: int
    def __init__(self, groups: _Optional[_Iterable[_Union[CompactionGroup, _Mapping]]] = ..., examined: _Optional[int] = ..., compacted: _Optional[int] = ...) -> None: ...

class ApplyRetentionRequest(_message.Message):
    __slots__ = ("fleet_id", "older_than_days", "dry_run")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_DAYS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    older_than_days: float
    dry_run: bool
    def __init__(self, fleet_id: _Optional[str] = ..., older_than_days: _Optional[float] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ApplyRetentionResponse(_message.Message):
    __slots__ = ("removed_ids",)
    REMOVED_IDS_FIELD_NUMBER: _ClassVar[int]
    removed_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, removed_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForgetRecordsRequest(_message.Message):
    __slots__ = ("agent_id", "record_id", "run_id", "match", "fleet_id", "erasure_id", "limit", "page_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    record_id: str
    run_id: str
    match: str
    fleet_id: str
    erasure_id: str
    limit: int
    page_token: str
    def __init__(self, agent_id: _Optional[str] = ..., record_id: _Optional[str] = ..., run_id: _Optional[str] = ..., match: _Optional[str] = ..., fleet_id: _Optional[str] = ..., erasure_id: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ForgottenRecord(_message.Message):
    __slots__ = ("record_id", "record_hash", "kind", "format")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_HASH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    record_hash: str
    kind: str
    format: int
    def __init__(self, record_id: _Optional[str] = ..., record_hash: _Optional[str] = ..., kind: _Optional[str] = ..., format: _Optional[int] = ...) -> None: ...

class ForgetRecordsResponse(_message.Message):
    __slots__ = ("records", "more", "erasure_id", "already_erased", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    ALREADY_ERASED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[ForgottenRecord]
    more: bool
    erasure_id: str
    already_erased: int
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[ForgottenRecord, _Mapping]]] = ..., more: _Optional[bool] = ..., erasure_id: _Optional[str] = ..., already_erased: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...
