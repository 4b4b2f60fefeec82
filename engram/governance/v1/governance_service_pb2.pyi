import datetime

from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrustTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRUST_TIER_UNSPECIFIED: _ClassVar[TrustTier]
    TRUST_TIER_TRUSTED: _ClassVar[TrustTier]
    TRUST_TIER_STANDARD: _ClassVar[TrustTier]
    TRUST_TIER_PROBATION: _ClassVar[TrustTier]
    TRUST_TIER_SUSPENDED: _ClassVar[TrustTier]

class GateStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GATE_STATUS_UNSPECIFIED: _ClassVar[GateStatus]
    GATE_STATUS_DECIDED: _ClassVar[GateStatus]
    GATE_STATUS_NEEDS_NEIGHBOURS: _ClassVar[GateStatus]
TRUST_TIER_UNSPECIFIED: TrustTier
TRUST_TIER_TRUSTED: TrustTier
TRUST_TIER_STANDARD: TrustTier
TRUST_TIER_PROBATION: TrustTier
TRUST_TIER_SUSPENDED: TrustTier
GATE_STATUS_UNSPECIFIED: GateStatus
GATE_STATUS_DECIDED: GateStatus
GATE_STATUS_NEEDS_NEIGHBOURS: GateStatus

class AgentTrust(_message.Message):
    __slots__ = ("fleet_id", "agent_id", "tier", "multiplier", "score", "pinned", "update_time")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    tier: TrustTier
    multiplier: float
    score: float
    pinned: bool
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., tier: _Optional[_Union[TrustTier, str]] = ..., multiplier: _Optional[float] = ..., score: _Optional[float] = ..., pinned: _Optional[bool] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Neighbour(_message.Message):
    __slots__ = ("record_id", "content", "agent_id", "score")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    content: str
    agent_id: str
    score: float
    def __init__(self, record_id: _Optional[str] = ..., content: _Optional[str] = ..., agent_id: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class WriteCandidate(_message.Message):
    __slots__ = ("record_id", "content_hash", "content", "run_id", "domain", "source", "importance", "tags", "neighbours", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    content_hash: str
    content: str
    run_id: str
    domain: str
    source: str
    importance: float
    tags: _containers.RepeatedScalarFieldContainer[str]
    neighbours: _containers.RepeatedCompositeFieldContainer[Neighbour]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, record_id: _Optional[str] = ..., content_hash: _Optional[str] = ..., content: _Optional[str] = ..., run_id: _Optional[str] = ..., domain: _Optional[str] = ..., source: _Optional[str] = ..., importance: _Optional[float] = ..., tags: _Optional[_Iterable[str]] = ..., neighbours: _Optional[_Iterable[_Union[Neighbour, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GateDecision(_message.Message):
    __slots__ = ("decision_id", "allowed", "rule_ids", "reason", "fleet_id", "agent_id", "request_id", "record_id", "content_hash", "create_time", "chain_seq", "position")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    RULE_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CHAIN_SEQ_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    allowed: bool
    rule_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    fleet_id: str
    agent_id: str
    request_id: str
    record_id: str
    content_hash: str
    create_time: _timestamp_pb2.Timestamp
    chain_seq: int
    position: int
    def __init__(self, decision_id: _Optional[str] = ..., allowed: _Optional[bool] = ..., rule_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., request_id: _Optional[str] = ..., record_id: _Optional[str] = ..., content_hash: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., chain_seq: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class DecideWritesRequest(_message.Message):
    __slots__ = ("fleet_id", "agent_id", "request_id", "candidates", "neighbours_omitted")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_OMITTED_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    request_id: str
    candidates: _containers.RepeatedCompositeFieldContainer[WriteCandidate]
    neighbours_omitted: bool
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., request_id: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[WriteCandidate, _Mapping]]] = ..., neighbours_omitted: _Optional[bool] = ...) -> None: ...

class DecideWritesResponse(_message.Message):
    __slots__ = ("decisions", "replayed", "status")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[GateDecision]
    replayed: bool
    status: GateStatus
    def __init__(self, decisions: _Optional[_Iterable[_Union[GateDecision, _Mapping]]] = ..., replayed: _Optional[bool] = ..., status: _Optional[_Union[GateStatus, str]] = ...) -> None: ...

class DecideWriteBatchesRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[DecideWritesRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[DecideWritesRequest, _Mapping]]] = ...) -> None: ...

class GateError(_message.Message):
    __slots__ = ("code", "reason", "message", "metadata", "retry_delay")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    code: str
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    retry_delay: _duration_pb2.Duration
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DecideWriteBatchResult(_message.Message):
    __slots__ = ("reply", "error")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reply: DecideWritesResponse
    error: GateError
    def __init__(self, reply: _Optional[_Union[DecideWritesResponse, _Mapping]] = ..., error: _Optional[_Union[GateError, _Mapping]] = ...) -> None: ...

class DecideWriteBatchesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DecideWriteBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DecideWriteBatchResult, _Mapping]]] = ...) -> None: ...

class GetTrustRequest(_message.Message):
    __slots__ = ("fleet_id", "agent_id")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class GetTrustResponse(_message.Message):
    __slots__ = ("trust",)
    TRUST_FIELD_NUMBER: _ClassVar[int]
    trust: AgentTrust
    def __init__(self, trust: _Optional[_Union[AgentTrust, _Mapping]] = ...) -> None: ...

class BatchGetTrustRequest(_message.Message):
    __slots__ = ("fleet_id", "agent_ids")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, fleet_id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchGetTrustResponse(_message.Message):
    __slots__ = ("trusts",)
    TRUSTS_FIELD_NUMBER: _ClassVar[int]
    trusts: _containers.RepeatedCompositeFieldContainer[AgentTrust]
    def __init__(self, trusts: _Optional[_Iterable[_Union[AgentTrust, _Mapping]]] = ...) -> None: ...

class SetTierRequest(_message.Message):
    __slots__ = ("fleet_id", "agent_id", "tier", "reason")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    tier: TrustTier
    reason: str
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., tier: _Optional[_Union[TrustTier, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class SetTierResponse(_message.Message):
    __slots__ = ("trust",)
    TRUST_FIELD_NUMBER: _ClassVar[int]
    trust: AgentTrust
    def __init__(self, trust: _Optional[_Union[AgentTrust, _Mapping]] = ...) -> None: ...

class SizeLimit(_message.Message):
    __slots__ = ("max_bytes",)
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_bytes: int
    def __init__(self, max_bytes: _Optional[int] = ...) -> None: ...

class DenyPattern(_message.Message):
    __slots__ = ("pattern", "case_sensitive")
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    CASE_SENSITIVE_FIELD_NUMBER: _ClassVar[int]
    pattern: str
    case_sensitive: bool
    def __init__(self, pattern: _Optional[str] = ..., case_sensitive: _Optional[bool] = ...) -> None: ...

class RequiredTags(_message.Message):
    __slots__ = ("tags",)
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Iterable[str]] = ...) -> None: ...

class DomainAccess(_message.Message):
    __slots__ = ("allowed_domains",)
    ALLOWED_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    allowed_domains: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allowed_domains: _Optional[_Iterable[str]] = ...) -> None: ...

class RateLimit(_message.Message):
    __slots__ = ("max_writes", "window_seconds")
    MAX_WRITES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_writes: int
    window_seconds: int
    def __init__(self, max_writes: _Optional[int] = ..., window_seconds: _Optional[int] = ...) -> None: ...

class Contradiction(_message.Message):
    __slots__ = ("min_overlap",)
    MIN_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    min_overlap: float
    def __init__(self, min_overlap: _Optional[float] = ...) -> None: ...

class Rule(_message.Message):
    __slots__ = ("rule_id", "fleet_id", "description", "tiers", "size_limit", "deny_pattern", "required_tags", "domain_access", "rate_limit", "contradiction", "created_by", "create_time")
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    SIZE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DENY_PATTERN_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_TAGS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_ACCESS_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONTRADICTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    rule_id: str
    fleet_id: str
    description: str
    tiers: _containers.RepeatedScalarFieldContainer[TrustTier]
    size_limit: SizeLimit
    deny_pattern: DenyPattern
    required_tags: RequiredTags
    domain_access: DomainAccess
    rate_limit: RateLimit
    contradiction: Contradiction
    created_by: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, rule_id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., description: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TrustTier, str]]] = ..., size_limit: _Optional[_Union[SizeLimit, _Mapping]] = ..., deny_pattern: _Optional[_Union[DenyPattern, _Mapping]] = ..., required_tags: _Optional[_Union[RequiredTags, _Mapping]] = ..., domain_access: _Optional[_Union[DomainAccess, _Mapping]] = ..., rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., contradiction: _Optional[_Union[Contradiction, _Mapping]] = ..., created_by: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateRuleRequest(_message.Message):
    __slots__ = ("rule", "request_id")
    RULE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    rule: Rule
    request_id: str
    def __init__(self, rule: _Optional[_Union[Rule, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateRuleResponse(_message.Message):
    __slots__ = ("rule", "created")
    RULE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    rule: Rule
    created: bool
    def __init__(self, rule: _Optional[_Union[Rule, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListRulesRequest(_message.Message):
    __slots__ = ("fleet_id", "page_size", "page_token")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    page_size: int
    page_token: str
    def __init__(self, fleet_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRulesResponse(_message.Message):
    __slots__ = ("rules", "next_page_token")
    RULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[Rule]
    next_page_token: str
    def __init__(self, rules: _Optional[_Iterable[_Union[Rule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteRuleRequest(_message.Message):
    __slots__ = ("rule_id", "fleet_id")
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    rule_id: str
    fleet_id: str
    def __init__(self, rule_id: _Optional[str] = ..., fleet_id: _Optional[str] = ...) -> None: ...

class DeleteRuleResponse(_message.Message):
    __slots__ = ("rule_id",)
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    rule_id: str
    def __init__(self, rule_id: _Optional[str] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("fleet_id", "agent_id", "page_size", "page_token")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    page_size: int
    page_token: str
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions", "next_page_token")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[GateDecision]
    next_page_token: str
    def __init__(self, decisions: _Optional[_Iterable[_Union[GateDecision, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ChainCheckpoint(_message.Message):
    __slots__ = ("head", "length")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    head: str
    length: int
    def __init__(self, head: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class GetChainCheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetChainCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: ChainCheckpoint
    def __init__(self, checkpoint: _Optional[_Union[ChainCheckpoint, _Mapping]] = ...) -> None: ...

class VerifyChainRequest(_message.Message):
    __slots__ = ("since",)
    SINCE_FIELD_NUMBER: _ClassVar[int]
    since: ChainCheckpoint
    def __init__(self, since: _Optional[_Union[ChainCheckpoint, _Mapping]] = ...) -> None: ...

class VerifyChainResponse(_message.Message):
    __slots__ = ("ok", "checkpoint", "problems", "extends_since")
    OK_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    EXTENDS_SINCE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    checkpoint: ChainCheckpoint
    problems: _containers.RepeatedScalarFieldContainer[str]
    extends_since: bool
    def __init__(self, ok: _Optional[bool] = ..., checkpoint: _Optional[_Union[ChainCheckpoint, _Mapping]] = ..., problems: _Optional[_Iterable[str]] = ..., extends_since: _Optional[bool] = ...) -> None: ...

class BatchGetDecisionsRequest(_message.Message):
    __slots__ = ("fleet_id", "decision_ids")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_IDS_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    decision_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, fleet_id: _Optional[str] = ..., decision_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchGetDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[GateDecision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[GateDecision, _Mapping]]] = ...) -> None: ...

class RevokedToken(_message.Message):
    __slots__ = ("jti", "expire_time", "fleet_id", "agent_id", "revoke_time", "revoked_by", "reason")
    JTI_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REVOKE_TIME_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    jti: str
    expire_time: _timestamp_pb2.Timestamp
    fleet_id: str
    agent_id: str
    revoke_time: _timestamp_pb2.Timestamp
    revoked_by: str
    reason: str
    def __init__(self, jti: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., revoke_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_by: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("jti", "expire_time", "fleet_id", "agent_id", "reason")
    JTI_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    jti: str
    expire_time: _timestamp_pb2.Timestamp
    fleet_id: str
    agent_id: str
    reason: str
    def __init__(self, jti: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("revoked", "created")
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    revoked: RevokedToken
    created: bool
    def __init__(self, revoked: _Optional[_Union[RevokedToken, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class RevokedAgent(_message.Message):
    __slots__ = ("fleet_id", "agent_id", "issued_before", "revoke_time", "revoked_by", "reason")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    REVOKE_TIME_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    issued_before: _timestamp_pb2.Timestamp
    revoke_time: _timestamp_pb2.Timestamp
    revoked_by: str
    reason: str
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., issued_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoke_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_by: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeAgentTokensRequest(_message.Message):
    __slots__ = ("fleet_id", "agent_id", "reason")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    reason: str
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeAgentTokensResponse(_message.Message):
    __slots__ = ("revoked",)
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    revoked: RevokedAgent
    def __init__(self, revoked: _Optional[_Union[RevokedAgent, _Mapping]] = ...) -> None: ...

class AgentRef(_message.Message):
    __slots__ = ("fleet_id", "agent_id")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    agent_id: str
    def __init__(self, fleet_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class ListAccessRestrictionsRequest(_message.Message):
    __slots__ = ("since_version",)
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    since_version: int
    def __init__(self, since_version: _Optional[int] = ...) -> None: ...

class ListAccessRestrictionsResponse(_message.Message):
    __slots__ = ("version", "changed", "revoked_tokens", "revoked_agents", "suspended_agents")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AGENTS_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_AGENTS_FIELD_NUMBER: _ClassVar[int]
    version: int
    changed: bool
    revoked_tokens: _containers.RepeatedCompositeFieldContainer[RevokedToken]
    revoked_agents: _containers.RepeatedCompositeFieldContainer[RevokedAgent]
    suspended_agents: _containers.RepeatedCompositeFieldContainer[AgentRef]
    def __init__(self, version: _Optional[int] = ..., changed: _Optional[bool] = ..., revoked_tokens: _Optional[_Iterable[_Union[RevokedToken, _Mapping]]] = ..., revoked_agents: _Optional[_Iterable[_Union[RevokedAgent, _Mapping]]] = ..., suspended_agents: _Optional[_Iterable[_Union[AgentRef, _Mapping]]] = ...) -> None: ...

class ErasedItem(_message.Message):
    __slots__ = ("kind", "id", "leaf_hash")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEAF_HASH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    id: str
    leaf_hash: str
    def __init__(self, kind: _Optional[str] = ..., id: _Optional[str] = ..., leaf_hash: _Optional[str] = ...) -> None: ...

class Erasure(_message.Message):
    __slots__ = ("erasure_id", "fleet_id", "selector_kind", "selector_value", "requested_by", "reason", "items", "create_time", "chain_seq", "imported")
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_KIND_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_VALUE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CHAIN_SEQ_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    erasure_id: str
    fleet_id: str
    selector_kind: str
    selector_value: str
    requested_by: str
    reason: str
    items: _containers.RepeatedCompositeFieldContainer[ErasedItem]
    create_time: _timestamp_pb2.Timestamp
    chain_seq: int
    imported: bool
    def __init__(self, erasure_id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., selector_kind: _Optional[str] = ..., selector_value: _Optional[str] = ..., requested_by: _Optional[str] = ..., reason: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ErasedItem, _Mapping]]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., chain_seq: _Optional[int] = ..., imported: _Optional[bool] = ...) -> None: ...

class RecordErasureRequest(_message.Message):
    __slots__ = ("fleet_id", "selector_kind", "selector_value", "reason", "items", "request_id")
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_KIND_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    fleet_id: str
    selector_kind: str
    selector_value: str
    reason: str
    items: _containers.RepeatedCompositeFieldContainer[ErasedItem]
    request_id: str
    def __init__(self, fleet_id: _Optional[str] = ..., selector_kind: _Optional[str] = ..., selector_value: _Optional[str] = ..., reason: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ErasedItem, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RecordErasureResponse(_message.Message):
    __slots__ = ("erasure", "created")
    ERASURE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    erasure: Erasure
    created: bool
    def __init__(self, erasure: _Optional[_Union[Erasure, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetErasureRequest(_message.Message):
    __slots__ = ("erasure_id",)
    ERASURE_ID_FIELD_NUMBER: _ClassVar[int]
    erasure_id: str
    def __init__(self, erasure_id: _Optional[str] = ...) -> None: ...

class GetErasureResponse(_message.Message):
    __slots__ = ("erasure",)
    ERASURE_FIELD_NUMBER: _ClassVar[int]
    erasure: Erasure
    def __init__(self, erasure: _Optional[_Union[Erasure, _Mapping]] = ...) -> None: ...

class ListErasuresRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListErasuresResponse(_message.Message):
    __slots__ = ("erasures", "next_page_token")
    ERASURES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    erasures: _containers.RepeatedCompositeFieldContainer[Erasure]
    next_page_token: str
    def __init__(self, erasures: _Optional[_Iterable[_Union[Erasure, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ImportErasuresRequest(_message.Message):
    __slots__ = ("erasures",)
    ERASURES_FIELD_NUMBER: _ClassVar[int]
    erasures: _containers.RepeatedCompositeFieldContainer[Erasure]
    def __init__(self, erasures: _Optional[_Iterable[_Union[Erasure, _Mapping]]] = ...) -> None: ...

class ImportErasuresResponse(_message.Message):
    __slots__ = ("created", "already_present")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    created: int
    already_present: int
    def __init__(self, created: _Optional[int] = ..., already_present: _Optional[int] = ...) -> None: ...

class ImportDecisionsRequest(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[GateDecision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[GateDecision, _Mapping]]] = ...) -> None: ...

class ImportDecisionsResponse(_message.Message):
    __slots__ = ("created", "already_present")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    created: int
    already_present: int
    def __init__(self, created: _Optional[int] = ..., already_present: _Optional[int] = ...) -> None: ...
