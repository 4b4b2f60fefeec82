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

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_SUCCEEDED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
    RUN_STATUS_SYSTEM_ERROR: _ClassVar[RunStatus]

class PointerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POINTER_TYPE_UNSPECIFIED: _ClassVar[PointerType]
    POINTER_TYPE_ARTIFACT: _ClassVar[PointerType]
    POINTER_TYPE_EVIDENCE: _ClassVar[PointerType]
    POINTER_TYPE_MANIFEST: _ClassVar[PointerType]
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_SUCCEEDED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_SYSTEM_ERROR: RunStatus
POINTER_TYPE_UNSPECIFIED: PointerType
POINTER_TYPE_ARTIFACT: PointerType
POINTER_TYPE_EVIDENCE: PointerType
POINTER_TYPE_MANIFEST: PointerType

class Run(_message.Message):
    __slots__ = ("run_id", "fleet_id", "agent_id", "status", "stop_reason", "create_time", "stop_time", "event_count", "head_hash", "latest_snapshot_id", "metadata_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    STOP_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    LATEST_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    fleet_id: str
    agent_id: str
    status: RunStatus
    stop_reason: str
    create_time: _timestamp_pb2.Timestamp
    stop_time: _timestamp_pb2.Timestamp
    event_count: int
    head_hash: str
    latest_snapshot_id: str
    metadata_json: str
    def __init__(self, run_id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., stop_reason: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stop_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., event_count: _Optional[int] = ..., head_hash: _Optional[str] = ..., latest_snapshot_id: _Optional[str] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ("run_id", "metadata_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    metadata_json: str
    def __init__(self, run_id: _Optional[str] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: Run
    created: bool
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ("run_id", "status", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    status: RunStatus
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class StopRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ForgetRunsRequest(_message.Message):
    __slots__ = ("erasure_id",)
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    erasure_id: str
    def __init__(self, erasure_id: _Optional[str] = ...) -> None: ...

class ForgottenRun(_message.Message):
    __slots__ = ("run_id", "head_hash", "events", "snapshots", "artifacts", "manifests", "evidence")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    head_hash: str
    events: int
    snapshots: int
    artifacts: int
    manifests: int
    evidence: int
    def __init__(self, run_id: _Optional[str] = ..., head_hash: _Optional[str] = ..., events: _Optional[int] = ..., snapshots: _Optional[int] = ..., artifacts: _Optional[int] = ..., manifests: _Optional[int] = ..., evidence: _Optional[int] = ...) -> None: ...

class FindRunsRequest(_message.Message):
    __slots__ = ("match", "limit", "page_token")
    MATCH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    match: str
    limit: int
    page_token: str
    def __init__(self, match: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class FoundRun(_message.Message):
    __slots__ = ("run_id", "head_hash", "places", "items", "whole_run_needed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    PLACES_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    WHOLE_RUN_NEEDED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    head_hash: str
    places: _containers.RepeatedScalarFieldContainer[str]
    items: _containers.RepeatedCompositeFieldContainer[FoundItem]
    whole_run_needed: bool
    def __init__(self, run_id: _Optional[str] = ..., head_hash: _Optional[str] = ..., places: _Optional[_Iterable[str]] = ..., items: _Optional[_Iterable[_Union[FoundItem, _Mapping]]] = ..., whole_run_needed: _Optional[bool] = ...) -> None: ...

class FoundItem(_message.Message):
    __slots__ = ("kind", "id", "leaf_hash", "format")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEAF_HASH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    id: str
    leaf_hash: str
    format: int
    def __init__(self, kind: _Optional[str] = ..., id: _Optional[str] = ..., leaf_hash: _Optional[str] = ..., format: _Optional[int] = ...) -> None: ...

class FindRunsResponse(_message.Message):
    __slots__ = ("runs", "more", "next_page_token", "loose_items")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOOSE_ITEMS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[FoundRun]
    more: bool
    next_page_token: str
    loose_items: _containers.RepeatedCompositeFieldContainer[FoundItem]
    def __init__(self, runs: _Optional[_Iterable[_Union[FoundRun, _Mapping]]] = ..., more: _Optional[bool] = ..., next_page_token: _Optional[str] = ..., loose_items: _Optional[_Iterable[_Union[FoundItem, _Mapping]]] = ...) -> None: ...

class ForgetRunsResponse(_message.Message):
    __slots__ = ("runs", "already_erased", "events_erased", "snapshots_erased", "items_already_erased", "manifests_erased", "evidence_erased")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_ERASED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_ERASED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_ERASED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_ALREADY_ERASED_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_ERASED_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_ERASED_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[ForgottenRun]
    already_erased: int
    events_erased: int
    snapshots_erased: int
    items_already_erased: int
    manifests_erased: int
    evidence_erased: int
    def __init__(self, runs: _Optional[_Iterable[_Union[ForgottenRun, _Mapping]]] = ..., already_erased: _Optional[int] = ..., events_erased: _Optional[int] = ..., snapshots_erased: _Optional[int] = ..., items_already_erased: _Optional[int] = ..., manifests_erased: _Optional[int] = ..., evidence_erased: _Optional[int] = ...) -> None: ...

class Artifact(_message.Message):
    __slots__ = ("artifact_id", "run_id", "step_id", "path", "hash", "mime_type", "size_bytes", "create_time", "metadata_json")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    run_id: str
    step_id: str
    path: str
    hash: str
    mime_type: str
    size_bytes: int
    create_time: _timestamp_pb2.Timestamp
    metadata_json: str
    def __init__(self, artifact_id: _Optional[str] = ..., run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., path: _Optional[str] = ..., hash: _Optional[str] = ..., mime_type: _Optional[str] = ..., size_bytes: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class ArtifactHeader(_message.Message):
    __slots__ = ("run_id", "step_id", "name", "mime_type", "metadata_json", "expected_size_bytes", "expected_hash")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HASH_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_id: str
    name: str
    mime_type: str
    metadata_json: str
    expected_size_bytes: int
    expected_hash: str
    def __init__(self, run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., metadata_json: _Optional[str] = ..., expected_size_bytes: _Optional[int] = ..., expected_hash: _Optional[str] = ...) -> None: ...

class ArtifactTrailer(_message.Message):
    __slots__ = ("size_bytes", "sha256")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    sha256: str
    def __init__(self, size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class CreateArtifactRequest(_message.Message):
    __slots__ = ("header", "chunk", "trailer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    header: ArtifactHeader
    chunk: bytes
    trailer: ArtifactTrailer
    def __init__(self, header: _Optional[_Union[ArtifactHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., trailer: _Optional[_Union[ArtifactTrailer, _Mapping]] = ...) -> None: ...

class CreateArtifactResponse(_message.Message):
    __slots__ = ("artifact",)
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    artifact: Artifact
    def __init__(self, artifact: _Optional[_Union[Artifact, _Mapping]] = ...) -> None: ...

class GetArtifactRequest(_message.Message):
    __slots__ = ("artifact_id",)
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    def __init__(self, artifact_id: _Optional[str] = ...) -> None: ...

class GetArtifactResponse(_message.Message):
    __slots__ = ("artifact",)
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    artifact: Artifact
    def __init__(self, artifact: _Optional[_Union[Artifact, _Mapping]] = ...) -> None: ...

class ReadArtifactRequest(_message.Message):
    __slots__ = ("artifact_id", "chunk_size")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    chunk_size: int
    def __init__(self, artifact_id: _Optional[str] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class ReadArtifactResponse(_message.Message):
    __slots__ = ("artifact", "chunk")
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    artifact: Artifact
    chunk: bytes
    def __init__(self, artifact: _Optional[_Union[Artifact, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class ListArtifactsRequest(_message.Message):
    __slots__ = ("run_id", "step_id", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_id: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListArtifactsResponse(_message.Message):
    __slots__ = ("artifacts", "next_page_token")
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    artifacts: _containers.RepeatedCompositeFieldContainer[Artifact]
    next_page_token: str
    def __init__(self, artifacts: _Optional[_Iterable[_Union[Artifact, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ArtifactProblem(_message.Message):
    __slots__ = ("artifact_id", "path", "problem", "expected_hash", "actual_hash", "expected_size_bytes", "actual_size_bytes")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HASH_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_HASH_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    path: str
    problem: str
    expected_hash: str
    actual_hash: str
    expected_size_bytes: int
    actual_size_bytes: int
    def __init__(self, artifact_id: _Optional[str] = ..., path: _Optional[str] = ..., problem: _Optional[str] = ..., expected_hash: _Optional[str] = ..., actual_hash: _Optional[str] = ..., expected_size_bytes: _Optional[int] = ..., actual_size_bytes: _Optional[int] = ...) -> None: ...

class VerifyArtifactsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class VerifyArtifactsResponse(_message.Message):
    __slots__ = ("checked", "problems", "snapshots_checked", "snapshot_problems", "snapshots_tombstoned", "events_tombstoned", "tombstone_problems", "tombstones_unconfirmed", "manifests_checked", "manifest_problems", "runs_tombstoned")
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_TOMBSTONED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_TOMBSTONED_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONE_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    RUNS_TOMBSTONED_FIELD_NUMBER: _ClassVar[int]
    checked: int
    problems: _containers.RepeatedCompositeFieldContainer[ArtifactProblem]
    snapshots_checked: int
    snapshot_problems: _containers.RepeatedCompositeFieldContainer[SnapshotProblem]
    snapshots_tombstoned: int
    events_tombstoned: int
    tombstone_problems: _containers.RepeatedCompositeFieldContainer[TombstoneProblem]
    tombstones_unconfirmed: int
    manifests_checked: int
    manifest_problems: _containers.RepeatedCompositeFieldContainer[ManifestProblem]
    runs_tombstoned: int
    def __init__(self, checked: _Optional[int] = ..., problems: _Optional[_Iterable[_Union[ArtifactProblem, _Mapping]]] = ..., snapshots_checked: _Optional[int] = ..., snapshot_problems: _Optional[_Iterable[_Union[SnapshotProblem, _Mapping]]] = ..., snapshots_tombstoned: _Optional[int] = ..., events_tombstoned: _Optional[int] = ..., tombstone_problems: _Optional[_Iterable[_Union[TombstoneProblem, _Mapping]]] = ..., tombstones_unconfirmed: _Optional[int] = ..., manifests_checked: _Optional[int] = ..., manifest_problems: _Optional[_Iterable[_Union[ManifestProblem, _Mapping]]] = ..., runs_tombstoned: _Optional[int] = ...) -> None: ...

class ManifestProblem(_message.Message):
    __slots__ = ("manifest_id", "run_id", "problem", "expected_hash", "actual_hash")
    MANIFEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HASH_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_HASH_FIELD_NUMBER: _ClassVar[int]
    manifest_id: str
    run_id: str
    problem: str
    expected_hash: str
    actual_hash: str
    def __init__(self, manifest_id: _Optional[str] = ..., run_id: _Optional[str] = ..., problem: _Optional[str] = ..., expected_hash: _Optional[str] = ..., actual_hash: _Optional[str] = ...) -> None: ...

class TombstoneProblem(_message.Message):
    __slots__ = ("kind", "id", "run_id", "erasure_id", "problem", "leaf_hash")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    LEAF_HASH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    id: str
    run_id: str
    erasure_id: str
    problem: str
    leaf_hash: str
    def __init__(self, kind: _Optional[str] = ..., id: _Optional[str] = ..., run_id: _Optional[str] = ..., erasure_id: _Optional[str] = ..., problem: _Optional[str] = ..., leaf_hash: _Optional[str] = ...) -> None: ...

class SnapshotProblem(_message.Message):
    __slots__ = ("snapshot_id", "run_id", "problem", "expected_hash", "actual_hash")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HASH_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_HASH_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    run_id: str
    problem: str
    expected_hash: str
    actual_hash: str
    def __init__(self, snapshot_id: _Optional[str] = ..., run_id: _Optional[str] = ..., problem: _Optional[str] = ..., expected_hash: _Optional[str] = ..., actual_hash: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("run_id", "seq", "type", "payload_json", "manifest_id", "artifact_ids", "create_time", "prev_hash", "hash", "agent_id", "format", "salt", "payload_commitment", "erasure_id", "erase_time", "erased_by")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    ERASE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERASED_BY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    type: str
    payload_json: str
    manifest_id: str
    artifact_ids: _containers.RepeatedScalarFieldContainer[str]
    create_time: _timestamp_pb2.Timestamp
    prev_hash: str
    hash: str
    agent_id: str
    format: int
    salt: str
    payload_commitment: str
    erasure_id: str
    erase_time: _timestamp_pb2.Timestamp
    erased_by: str
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., type: _Optional[str] = ..., payload_json: _Optional[str] = ..., manifest_id: _Optional[str] = ..., artifact_ids: _Optional[_Iterable[str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., prev_hash: _Optional[str] = ..., hash: _Optional[str] = ..., agent_id: _Optional[str] = ..., format: _Optional[int] = ..., salt: _Optional[str] = ..., payload_commitment: _Optional[str] = ..., erasure_id: _Optional[str] = ..., erase_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., erased_by: _Optional[str] = ...) -> None: ...

class AppendEventRequest(_message.Message):
    __slots__ = ("run_id", "type", "payload_json", "manifest_id", "artifact_ids", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    type: str
    payload_json: str
    manifest_id: str
    artifact_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., type: _Optional[str] = ..., payload_json: _Optional[str] = ..., manifest_id: _Optional[str] = ..., artifact_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class AppendEventResponse(_message.Message):
    __slots__ = ("event", "created")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    event: Event
    created: bool
    def __init__(self, event: _Optional[_Union[Event, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("run_id", "after_seq", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_seq: int
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplayEventsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ReplayEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: Event
    def __init__(self, event: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("snapshot_id", "run_id", "seq", "state_json", "state_hash", "manifest_id", "artifact_ids", "create_time", "format", "salt", "erasure_id", "erase_time", "erased_by")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_HASH_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    ERASE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERASED_BY_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    run_id: str
    seq: int
    state_json: str
    state_hash: str
    manifest_id: str
    artifact_ids: _containers.RepeatedScalarFieldContainer[str]
    create_time: _timestamp_pb2.Timestamp
    format: int
    salt: str
    erasure_id: str
    erase_time: _timestamp_pb2.Timestamp
    erased_by: str
    def __init__(self, snapshot_id: _Optional[str] = ..., run_id: _Optional[str] = ..., seq: _Optional[int] = ..., state_json: _Optional[str] = ..., state_hash: _Optional[str] = ..., manifest_id: _Optional[str] = ..., artifact_ids: _Optional[_Iterable[str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., format: _Optional[int] = ..., salt: _Optional[str] = ..., erasure_id: _Optional[str] = ..., erase_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., erased_by: _Optional[str] = ...) -> None: ...

class CreateSnapshotRequest(_message.Message):
    __slots__ = ("run_id", "state_json", "seq", "manifest_id", "artifact_ids", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state_json: str
    seq: int
    manifest_id: str
    artifact_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., state_json: _Optional[str] = ..., seq: _Optional[int] = ..., manifest_id: _Optional[str] = ..., artifact_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateSnapshotResponse(_message.Message):
    __slots__ = ("snapshot", "created")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    created: bool
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetLatestSnapshotRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetLatestSnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("run_id", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots", "next_page_token")
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    next_page_token: str
    def __init__(self, snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RehydrateRequest(_message.Message):
    __slots__ = ("run_id", "max_events")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    max_events: int
    def __init__(self, run_id: _Optional[str] = ..., max_events: _Optional[int] = ...) -> None: ...

class RehydrateResponse(_message.Message):
    __slots__ = ("run", "snapshot", "events", "truncated", "manifest")
    RUN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    run: Run
    snapshot: Snapshot
    events: _containers.RepeatedCompositeFieldContainer[Event]
    truncated: bool
    manifest: Manifest
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., truncated: _Optional[bool] = ..., manifest: _Optional[_Union[Manifest, _Mapping]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Evidence(_message.Message):
    __slots__ = ("evidence_id", "corpus_id", "index_id", "chunk_id", "span", "artifact_id", "metadata_json", "create_time")
    EVIDENCE_ID_FIELD_NUMBER: _ClassVar[int]
    CORPUS_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    evidence_id: str
    corpus_id: str
    index_id: str
    chunk_id: str
    span: Span
    artifact_id: str
    metadata_json: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, evidence_id: _Optional[str] = ..., corpus_id: _Optional[str] = ..., index_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., span: _Optional[_Union[Span, _Mapping]] = ..., artifact_id: _Optional[str] = ..., metadata_json: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateEvidenceRequest(_message.Message):
    __slots__ = ("corpus_id", "index_id", "chunk_id", "span", "artifact_id", "metadata_json")
    CORPUS_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    corpus_id: str
    index_id: str
    chunk_id: str
    span: Span
    artifact_id: str
    metadata_json: str
    def __init__(self, corpus_id: _Optional[str] = ..., index_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., span: _Optional[_Union[Span, _Mapping]] = ..., artifact_id: _Optional[str] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class CreateEvidenceResponse(_message.Message):
    __slots__ = ("evidence", "created")
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    evidence: Evidence
    created: bool
    def __init__(self, evidence: _Optional[_Union[Evidence, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetEvidenceRequest(_message.Message):
    __slots__ = ("evidence_id",)
    EVIDENCE_ID_FIELD_NUMBER: _ClassVar[int]
    evidence_id: str
    def __init__(self, evidence_id: _Optional[str] = ...) -> None: ...

class GetEvidenceResponse(_message.Message):
    __slots__ = ("evidence",)
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    evidence: Evidence
    def __init__(self, evidence: _Optional[_Union[Evidence, _Mapping]] = ...) -> None: ...

class ListEvidenceRequest(_message.Message):
    __slots__ = ("corpus_id", "index_id", "page_size", "page_token")
    CORPUS_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    corpus_id: str
    index_id: str
    page_size: int
    page_token: str
    def __init__(self, corpus_id: _Optional[str] = ..., index_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEvidenceResponse(_message.Message):
    __slots__ = ("evidence", "next_page_token")
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    evidence: _containers.RepeatedCompositeFieldContainer[Evidence]
    next_page_token: str
    def __init__(self, evidence: _Optional[_Iterable[_Union[Evidence, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("manifest_id", "run_id", "content_json", "content_hash", "create_time", "format", "salt")
    MANIFEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    manifest_id: str
    run_id: str
    content_json: str
    content_hash: str
    create_time: _timestamp_pb2.Timestamp
    format: int
    salt: str
    def __init__(self, manifest_id: _Optional[str] = ..., run_id: _Optional[str] = ..., content_json: _Optional[str] = ..., content_hash: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., format: _Optional[int] = ..., salt: _Optional[str] = ...) -> None: ...

class CreateManifestRequest(_message.Message):
    __slots__ = ("content_json", "run_id")
    CONTENT_JSON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    content_json: str
    run_id: str
    def __init__(self, content_json: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class CreateManifestResponse(_message.Message):
    __slots__ = ("manifest", "created")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    manifest: Manifest
    created: bool
    def __init__(self, manifest: _Optional[_Union[Manifest, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetManifestRequest(_message.Message):
    __slots__ = ("manifest_id",)
    MANIFEST_ID_FIELD_NUMBER: _ClassVar[int]
    manifest_id: str
    def __init__(self, manifest_id: _Optional[str] = ...) -> None: ...

class GetManifestResponse(_message.Message):
    __slots__ = ("manifest",)
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    manifest: Manifest
    def __init__(self, manifest: _Optional[_Union[Manifest, _Mapping]] = ...) -> None: ...

class ListManifestsRequest(_message.Message):
    __slots__ = ("run_id", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListManifestsResponse(_message.Message):
    __slots__ = ("manifests", "next_page_token")
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    manifests: _containers.RepeatedCompositeFieldContainer[Manifest]
    next_page_token: str
    def __init__(self, manifests: _Optional[_Iterable[_Union[Manifest, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Pointer(_message.Message):
    __slots__ = ("type", "id")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    type: PointerType
    id: str
    def __init__(self, type: _Optional[_Union[PointerType, str]] = ..., id: _Optional[str] = ...) -> None: ...

class ResolvePointerRequest(_message.Message):
    __slots__ = ("run_id", "pointer", "critical")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POINTER_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    pointer: Pointer
    critical: bool
    def __init__(self, run_id: _Optional[str] = ..., pointer: _Optional[_Union[Pointer, _Mapping]] = ..., critical: _Optional[bool] = ...) -> None: ...

class ResolvePointerResponse(_message.Message):
    __slots__ = ("resolved", "attempts", "path", "hash")
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    resolved: bool
    attempts: int
    path: str
    hash: str
    def __init__(self, resolved: _Optional[bool] = ..., attempts: _Optional[int] = ..., path: _Optional[str] = ..., hash: _Optional[str] = ...) -> None: ...

class ImportRunRequest(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ImportRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: Run
    created: bool
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ImportArtifactRequest(_message.Message):
    __slots__ = ("artifact", "chunk", "trailer")
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    artifact: Artifact
    chunk: bytes
    trailer: ArtifactTrailer
    def __init__(self, artifact: _Optional[_Union[Artifact, _Mapping]] = ..., chunk: _Optional[bytes] = ..., trailer: _Optional[_Union[ArtifactTrailer, _Mapping]] = ...) -> None: ...

class ImportArtifactResponse(_message.Message):
    __slots__ = ("artifact", "created")
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    artifact: Artifact
    created: bool
    def __init__(self, artifact: _Optional[_Union[Artifact, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ImportRunItemsRequest(_message.Message):
    __slots__ = ("manifests", "evidence", "events", "snapshots")
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    manifests: _containers.RepeatedCompositeFieldContainer[Manifest]
    evidence: _containers.RepeatedCompositeFieldContainer[Evidence]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    def __init__(self, manifests: _Optional[_Iterable[_Union[Manifest, _Mapping]]] = ..., evidence: _Optional[_Iterable[_Union[Evidence, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ...) -> None: ...

class ImportRunItemsResponse(_message.Message):
    __slots__ = ("created", "already_present")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    created: int
    already_present: int
    def __init__(self, created: _Optional[int] = ..., already_present: _Optional[int] = ...) -> None: ...
