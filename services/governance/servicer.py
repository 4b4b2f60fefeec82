"""gRPC edge of governance: protos in, service calls, protos out; who may call what."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from engram.governance.v1 import governance_service_pb2 as pb
from engram.governance.v1 import governance_service_pb2_grpc as pb_grpc
from services.common.access import AccessRestrictions
from services.common.admission import READ, WRITE, MethodKinds
from services.common.auth import (
    ARTIFACTS_SERVICE,
    COMPACTOR_SERVICE,
    PEOPLE,
    SERVICE_ROLE,
    SHARD_SERVICE,
    MethodPolicy,
    current_principal,
    is_caller,
    target_fleet,
)
from services.common.erasure_source import MAX_ERASURE_ITEMS, TextScans
from services.common.errors import EngramError, InvalidArgument, NotFound, PermissionDenied
from services.common.limits import check_limit, validate_request_id
from services.common.pagination import PageTokens
from services.common.settings import LIMIT_DEFAULTS, LimitsSettings
from services.common.timestamps import MAX_CLOCK_SKEW_US, time_us
from services.common.tokens import MAX_TTL_SECONDS, Principal, validate_identifier
from services.governance.domain.decisions import (
    MAX_DECISION_RULES,
    Decision,
    PositionSearch,
)
from services.governance.domain.erasures import (
    ErasedItem,
    Erasure,
    check_erasure_id,
    erasure_id_for,
)
from services.governance.domain.erasures import check_request as check_erasure
from services.governance.domain.revocation import AgentRevocation, TokenRevocation
from services.governance.domain.rules import (
    Candidate,
    Neighbour,
    Rule,
    RuleKind,
    validate_params,
)
from services.governance.domain.tiers import AgentTrust, TrustTier
from services.governance.domain.witness import Checkpoint
from services.governance.service import (
    MAX_GATE_GROUP,
    GateOutcome,
    GateRequest,
    GovernanceService,
)

log = logging.getLogger("engram.governance.gate")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GovernanceService"].full_name
_GOVERNORS = frozenset({"governor", "admin"})
_ERASING = frozenset({SHARD_SERVICE, ARTIFACTS_SERVICE, COMPACTOR_SERVICE})
"""The services that erase what a recorded erasure lists (any fleet's: each checks its own)."""
MAX_NEIGHBOURS = 50
VERIFY_SLOTS = 2
"""Chain verifications (VerifyChain) running at once; one more is RESOURCE_EXHAUSTED SCAN_BUSY."""


def _m(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


POLICY: MethodPolicy = {  # a service token may call only the gate RPCs, and only the shard's
    _m("DecideWrites"): frozenset({SHARD_SERVICE}),
    _m("DecideWriteBatches"): frozenset({SHARD_SERVICE}),
    _m("GetTrust"): PEOPLE,
    _m("BatchGetTrust"): frozenset({SHARD_SERVICE, "governor", "admin"}),
    _m("SetTier"): _GOVERNORS,
    _m("CreateRule"): _GOVERNORS,
    _m("ListRules"): PEOPLE,
    _m("DeleteRule"): _GOVERNORS,
    _m("ListDecisions"): PEOPLE,
    _m("GetChainCheckpoint"): PEOPLE,
    _m("VerifyChain"): _GOVERNORS,
    _m("BatchGetDecisions"): _GOVERNORS,
    # Decisions another governance recorded, kept as they were: an admin's act (bundles).
    _m("ImportDecisions"): frozenset({"admin"}),
    _m("RevokeToken"): _GOVERNORS,
    _m("RevokeAgentTokens"): _GOVERNORS,
    _m("ListAccessRestrictions"): frozenset({SERVICE_ROLE}),  # the feed every service reads
    _m("RecordErasure"): _GOVERNORS,
    # each service that holds erasable data reads an erasure before it erases what it lists
    _m("GetErasure"): _ERASING | _GOVERNORS,
    _m("ListErasures"): _GOVERNORS,
    # Erasures another governance recorded, kept as they were: an admin's act (bundles).
    _m("ImportErasures"): frozenset({"admin"}),
}
SUSPENDED_MAY_CALL = frozenset({_m("GetTrust")})
"""A suspended agent may still read its own tier (and nothing else, anywhere)."""
assert set(POLICY) == {
    _m(m.name) for m in pb.DESCRIPTOR.services_by_name["GovernanceService"].methods
}
KINDS: MethodKinds = {  # which rate limit each RPC counts against
    **{_m(name): WRITE for name in ("DecideWrites", "DecideWriteBatches", "SetTier",
                                    "CreateRule", "DeleteRule", "RevokeToken",
                                    "RevokeAgentTokens", "RecordErasure", "ImportDecisions",
                                    "ImportErasures")},
    **{_m(name): READ for name in (
        "GetTrust", "BatchGetTrust", "ListRules", "ListDecisions", "GetChainCheckpoint",
        "VerifyChain", "BatchGetDecisions", "ListAccessRestrictions", "GetErasure",
        "ListErasures")},
}
assert set(KINDS) == set(POLICY)

_TIERS: dict[TrustTier, Any] = {
    TrustTier.TRUSTED: pb.TRUST_TIER_TRUSTED,
    TrustTier.STANDARD: pb.TRUST_TIER_STANDARD,
    TrustTier.PROBATION: pb.TRUST_TIER_PROBATION,
    TrustTier.SUSPENDED: pb.TRUST_TIER_SUSPENDED,
}
_TIERS_BACK: dict[Any, TrustTier] = {v: k for k, v in _TIERS.items()}
_KINDS = {kind.value: kind for kind in RuleKind}


def _timestamp(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def _bounded(kind: str, text: str, limit: int) -> str:
    if len(text) > limit:
        raise InvalidArgument(f"{kind} is {len(text)} characters; at most {limit}")
    return text


def tier_from_proto(value: int) -> TrustTier:
    tier = _TIERS_BACK.get(value)
    if tier is None:
        raise InvalidArgument("tier must be one of trusted, standard, probation, suspended",
                              reason="INVALID_TIER")
    return tier


def trust_to_proto(trust: AgentTrust) -> pb.AgentTrust:
    return pb.AgentTrust(
        fleet_id=trust.fleet_id, agent_id=trust.agent_id, tier=_TIERS[trust.tier],
        multiplier=trust.multiplier, score=trust.score / 1000, pinned=trust.pinned,
        update_time=_timestamp(trust.updated_ms) if trust.updated_ms else None,
    )


def decision_to_proto(decision: Decision) -> pb.GateDecision:
    return pb.GateDecision(
        decision_id=decision.decision_id, allowed=decision.allowed,
        rule_ids=list(decision.rule_ids), reason=decision.reason, fleet_id=decision.fleet_id,
        agent_id=decision.agent_id, request_id=decision.request_id,
        record_id=decision.record_id, content_hash=decision.content_hash,
        create_time=_timestamp(decision.created_ms), chain_seq=decision.chain_seq,
        position=decision.position,
    )


def rule_to_proto(rule: Rule) -> pb.Rule:
    message = pb.Rule(
        rule_id=rule.rule_id, fleet_id=rule.fleet_id, description=rule.description,
        tiers=[_TIERS[t] for t in rule.tiers], created_by=rule.created_by,
        create_time=_timestamp(rule.created_ms),
    )
    p = rule.params
    if rule.kind is RuleKind.SIZE_LIMIT:
        message.size_limit.max_bytes = p["max_bytes"]
    elif rule.kind is RuleKind.DENY_PATTERN:
        message.deny_pattern.CopyFrom(
            pb.DenyPattern(pattern=p["pattern"], case_sensitive=p["case_sensitive"]))
    elif rule.kind is RuleKind.REQUIRED_TAGS:
        message.required_tags.tags.extend(p["tags"])
    elif rule.kind is RuleKind.DOMAIN_ACCESS:
        message.domain_access.allowed_domains.extend(p["allowed_domains"])
    elif rule.kind is RuleKind.RATE_LIMIT:
        message.rate_limit.CopyFrom(
            pb.RateLimit(max_writes=p["max_writes"], window_seconds=p["window_seconds"]))
    else:
        message.contradiction.min_overlap = p["min_overlap"]
    return message


def rule_kind_and_params(message: pb.Rule) -> tuple[RuleKind, dict[str, Any]]:
    which = message.WhichOneof("kind")
    if which is None:
        raise InvalidArgument("a rule needs a kind: size_limit, deny_pattern, required_tags, "
                              "domain_access, rate_limit or contradiction", reason="INVALID_RULE")
    kind = _KINDS[which]
    body = getattr(message, which)
    raw: dict[str, Any]
    if kind is RuleKind.SIZE_LIMIT:
        raw = {"max_bytes": body.max_bytes}
    elif kind is RuleKind.DENY_PATTERN:
        raw = {"pattern": body.pattern, "case_sensitive": body.case_sensitive}
    elif kind is RuleKind.REQUIRED_TAGS:
        raw = {"tags": list(body.tags)}
    elif kind is RuleKind.DOMAIN_ACCESS:
        raw = {"allowed_domains": list(body.allowed_domains)}
    elif kind is RuleKind.RATE_LIMIT:
        raw = {"max_writes": body.max_writes, "window_seconds": body.window_seconds}
    else:
        raw = {"min_overlap": body.min_overlap}
    return kind, validate_params(kind, raw)


def _candidate(message: pb.WriteCandidate, limits: LimitsSettings) -> Candidate:
    if not message.record_id or not message.content_hash:
        raise InvalidArgument("every candidate needs record_id and content_hash",
                              reason="INVALID_CANDIDATE")
    validate_identifier("record_id", message.record_id)
    if message.run_id:
        validate_identifier("run_id", message.run_id)
    check_limit("a candidate's content", len(message.content.encode()), limits.content_bytes,
                "ENGRAM_LIMITS_CONTENT_BYTES", "bytes")
    check_limit("a candidate's tags", len(message.tags), limits.tags_per_record,
                "ENGRAM_LIMITS_TAGS_PER_RECORD", "tags")
    if len(message.neighbours) > MAX_NEIGHBOURS:
        raise InvalidArgument(f"at most {MAX_NEIGHBOURS} neighbours per candidate")
    return Candidate(
        record_id=message.record_id, content_hash=message.content_hash,
        content=message.content, run_id=message.run_id, domain=message.domain,
        source=message.source, importance=message.importance, tags=tuple(message.tags),
        neighbours=tuple(Neighbour(n.record_id, n.content, n.agent_id, n.score)
                         for n in message.neighbours),
        metadata=tuple(sorted(message.metadata.items())),
    )


def is_gate_caller(principal: Principal) -> bool:
    """The shard's service principal: it gates writes and reads trust for every fleet."""
    return is_caller(principal, SHARD_SERVICE)


def _is_plain_agent(principal: Principal) -> bool:
    return not principal.has_any(frozenset({"governor", "admin", "service"}))


def revoked_token_to_proto(revocation: TokenRevocation) -> pb.RevokedToken:
    return pb.RevokedToken(
        jti=revocation.jti, expire_time=_timestamp(revocation.expires_ms),
        fleet_id=revocation.fleet_id, agent_id=revocation.agent_id,
        revoke_time=_timestamp(revocation.revoked_ms), revoked_by=revocation.revoked_by,
        reason=revocation.reason)


def revoked_agent_to_proto(revocation: AgentRevocation) -> pb.RevokedAgent:
    return pb.RevokedAgent(
        fleet_id=revocation.fleet_id, agent_id=revocation.agent_id,
        issued_before=_timestamp(revocation.issued_before_s * 1000),
        revoke_time=_timestamp(revocation.revoked_ms), revoked_by=revocation.revoked_by,
        reason=revocation.reason)


def _gate_error(error: EngramError) -> pb.GateError:
    """What ``error`` would have said as the status of a call of its own."""
    failed = pb.GateError(code=error.code, reason=error.reason, message=error.message,
                          metadata={k: str(v) for k, v in error.metadata.items()})
    if error.retry_delay is not None:
        failed.retry_delay.FromNanoseconds(int(error.retry_delay * 1e9))
    return failed


def _gate_reply(outcome: GateOutcome) -> pb.DecideWritesResponse:
    if outcome.needs_neighbours:
        return pb.DecideWritesResponse(status=pb.GATE_STATUS_NEEDS_NEIGHBOURS)
    return pb.DecideWritesResponse(
        decisions=[decision_to_proto(d) for d in outcome.decisions],
        replayed=outcome.replayed, status=pb.GATE_STATUS_DECIDED)


class GovernanceServicer(pb_grpc.GovernanceServiceServicer):
    def __init__(self, service: GovernanceService, *, pages: PageTokens | None = None,
                 limits: LimitsSettings = LIMIT_DEFAULTS,
                 restrictions: AccessRestrictions | None = None) -> None:
        self._service = service
        self._pages = pages or PageTokens.ephemeral(limits)
        self._limits = limits
        self._restrictions = restrictions
        # A verification replays the whole chain, every fleet's history: at most two at once,
        # so a governor (of any fleet) looping VerifyChain cannot take the workers every
        # fleet's gate needs (found by a review, 2026-11-29).
        self._verifications = TextScans(VERIFY_SLOTS)

    def DecideWrites(self, request: pb.DecideWritesRequest,
                     context: grpc.ServicerContext) -> pb.DecideWritesResponse:
        self._service.require_writable()
        gate = self._gate_request(request)
        return _gate_reply(self._service.decide(
            gate.fleet_id, gate.agent_id, gate.request_id, gate.candidates,
            neighbours_omitted=gate.neighbours_omitted, active=context.is_active))

    def DecideWriteBatches(self, request: pb.DecideWriteBatchesRequest,
                           context: grpc.ServicerContext) -> pb.DecideWriteBatchesResponse:
        self._service.require_writable()
        if not request.requests:
            raise InvalidArgument("send at least one request", reason="INVALID_CANDIDATE")
        check_limit("requests", len(request.requests), MAX_GATE_GROUP,
                    "the gate's group size")
        check_limit("candidates of all requests", sum(len(r.candidates) for r in request.requests),
                    self._limits.batch_items, "ENGRAM_LIMITS_BATCH_ITEMS")
        gates = []
        for i, one in enumerate(request.requests):
            try:
                gates.append(self._gate_request(one))
            except EngramError as error:  # the whole call is refused: nothing recorded
                raise type(error)(f"requests[{i}]: {error.message}", reason=error.reason,
                                  metadata=error.metadata) from None
        results = []
        for outcome in self._service.decide_all(gates, context.is_active):
            if isinstance(outcome, EngramError):
                results.append(pb.DecideWriteBatchResult(error=_gate_error(outcome)))
            elif isinstance(outcome, BaseException):
                # Not a refusal, but the call must not fail as a whole: the others' decisions
                # are recorded, and a failed call would have the shard decide them again.
                if not isinstance(outcome, Exception):
                    raise outcome
                log.error("a coalesced gate request failed", exc_info=outcome)
                results.append(pb.DecideWriteBatchResult(error=pb.GateError(
                    code="INTERNAL", reason="GATE_REQUEST_FAILED",
                    message="governance failed to decide this request (logged); retry")))
            else:
                results.append(pb.DecideWriteBatchResult(reply=_gate_reply(outcome)))
        return pb.DecideWriteBatchesResponse(results=results)

    def _gate_request(self, request: pb.DecideWritesRequest) -> GateRequest:
        fleet_id = validate_identifier("fleet_id", request.fleet_id)
        agent_id = validate_identifier("agent_id", request.agent_id)
        if not request.request_id or len(request.request_id) > 128:
            raise InvalidArgument("request_id is required (1..128 characters) so a retry "
                                  "does not record a second decision", reason="REQUEST_ID_REQUIRED")
        validate_request_id(request.request_id)
        if not request.candidates:
            raise InvalidArgument("send at least one candidate", reason="INVALID_CANDIDATE")
        check_limit("candidates", len(request.candidates), self._limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS")
        candidates = [_candidate(c, self._limits) for c in request.candidates]
        if request.neighbours_omitted and any(c.neighbours for c in candidates):
            raise InvalidArgument("neighbours_omitted is set but candidates carry neighbours; "
                                  "send all of them with neighbours_omitted false",
                                  reason="INVALID_CANDIDATE")
        return GateRequest(fleet_id, agent_id, request.request_id, tuple(candidates),
                           request.neighbours_omitted)

    def GetTrust(self, request: pb.GetTrustRequest,
                 context: grpc.ServicerContext) -> pb.GetTrustResponse:
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id)
        agent_id = request.agent_id or principal.agent_id
        own = agent_id == principal.agent_id and fleet_id == principal.fleet_id
        if _is_plain_agent(principal) and agent_id != principal.agent_id:
            raise PermissionDenied("agents may read only their own trust", reason="NOT_OWN_TRUST")
        if not own and self._restrictions is not None:
            self._restrictions.check(principal, "")  # suspended: only its own tier
        validate_identifier("agent_id", agent_id)
        trust = self._service.trust_of(fleet_id, [agent_id])[agent_id]
        return pb.GetTrustResponse(trust=trust_to_proto(trust))

    def BatchGetTrust(self, request: pb.BatchGetTrustRequest,
                      context: grpc.ServicerContext) -> pb.BatchGetTrustResponse:
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id, cross_fleet=is_gate_caller(principal))
        check_limit("agent_ids", len(request.agent_ids), self._limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS")
        agent_ids = [validate_identifier("agent_id", a) for a in request.agent_ids if a]
        trusts = self._service.trust_of(fleet_id, agent_ids)
        return pb.BatchGetTrustResponse(trusts=[trust_to_proto(t) for t in trusts.values()])

    def SetTier(self, request: pb.SetTierRequest,
                context: grpc.ServicerContext) -> pb.SetTierResponse:
        self._service.require_writable()
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id)
        agent_id = validate_identifier("agent_id", request.agent_id)
        tier = tier_from_proto(request.tier)
        trust = self._service.set_tier(fleet_id, agent_id, tier, principal.agent_id,
                                       request.reason[:1000])
        return pb.SetTierResponse(trust=trust_to_proto(trust))

    def CreateRule(self, request: pb.CreateRuleRequest,
                   context: grpc.ServicerContext) -> pb.CreateRuleResponse:
        self._service.require_writable()
        principal = current_principal()
        fleet_id = target_fleet(principal, request.rule.fleet_id)
        kind, params = rule_kind_and_params(request.rule)
        if request.request_id:
            validate_request_id(request.request_id)
        rule = Rule(
            rule_id=self._service.allocate_rule_id(fleet_id, request.request_id),
            fleet_id=fleet_id, kind=kind, params=params,
            description=request.rule.description[:1000],
            tiers=tuple(dict.fromkeys(tier_from_proto(t) for t in request.rule.tiers)),
            created_by=principal.agent_id, created_ms=self._service.now_ms(),
        )
        stored, created = self._service.create_rule(rule)
        return pb.CreateRuleResponse(rule=rule_to_proto(stored), created=created)

    def ListRules(self, request: pb.ListRulesRequest,
                  context: grpc.ServicerContext) -> pb.ListRulesResponse:
        fleet_id = target_fleet(current_principal(), request.fleet_id)
        rules, token = self._pages.paginate(
            request.page_token, request.page_size, {"fleet_id": fleet_id},
            lambda after, limit: self._service.list_rules(
                fleet_id, str(after[0]) if after else None, limit),
            lambda rule: [rule.rule_id])
        return pb.ListRulesResponse(rules=[rule_to_proto(r) for r in rules],
                                    next_page_token=token)

    def DeleteRule(self, request: pb.DeleteRuleRequest,
                   context: grpc.ServicerContext) -> pb.DeleteRuleResponse:
        self._service.require_writable()
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id)
        validate_identifier("rule_id", request.rule_id)
        self._service.delete_rule(fleet_id, request.rule_id, principal.agent_id)
        return pb.DeleteRuleResponse(rule_id=request.rule_id)

    def ListDecisions(self, request: pb.ListDecisionsRequest,
                      context: grpc.ServicerContext) -> pb.ListDecisionsResponse:
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id)
        agent_id = request.agent_id
        if _is_plain_agent(principal):
            if agent_id and agent_id != principal.agent_id:
                raise PermissionDenied("agents may list only their own decisions",
                                       reason="NOT_OWN_DECISIONS")
            agent_id = principal.agent_id
        if agent_id:
            validate_identifier("agent_id", agent_id)
        decisions, token = self._pages.paginate(
            request.page_token, request.page_size, {"fleet_id": fleet_id, "agent_id": agent_id},
            lambda before, limit: self._service.list_decisions(
                fleet_id, agent_id or None, int(before[0]) if before else None, limit),
            lambda decision: [decision.chain_seq])
        return pb.ListDecisionsResponse(
            decisions=[decision_to_proto(d) for d in decisions], next_page_token=token)

    def GetChainCheckpoint(self, request: pb.GetChainCheckpointRequest,
                           context: grpc.ServicerContext) -> pb.GetChainCheckpointResponse:
        checkpoint = self._service.checkpoint()
        return pb.GetChainCheckpointResponse(checkpoint=pb.ChainCheckpoint(
            head=checkpoint.head, length=checkpoint.length))

    def VerifyChain(self, request: pb.VerifyChainRequest,
                    context: grpc.ServicerContext) -> pb.VerifyChainResponse:
        since = (Checkpoint(request.since.head, request.since.length)
                 if request.HasField("since") else None)
        with self._verifications.slot("VerifyChain"):
            report = self._service.verify_chain(since)
        return pb.VerifyChainResponse(
            ok=report.ok, checkpoint=pb.ChainCheckpoint(head=report.checkpoint.head,
                                                       length=report.checkpoint.length),
            problems=report.problems, extends_since=report.extends_since)

    def BatchGetDecisions(self, request: pb.BatchGetDecisionsRequest,
                          context: grpc.ServicerContext) -> pb.BatchGetDecisionsResponse:
        fleet_id = target_fleet(current_principal(), request.fleet_id)
        if not request.decision_ids:
            raise InvalidArgument("send at least one decision_id", reason="INVALID_DECISION_IDS")
        check_limit("decision_ids", len(request.decision_ids), self._limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS")
        decision_ids = [validate_identifier("decision_id", d) for d in request.decision_ids]
        found = self._service.decisions_by_id(fleet_id, decision_ids)
        return pb.BatchGetDecisionsResponse(decisions=[decision_to_proto(d) for d in found])

    def ImportDecisions(self, request: pb.ImportDecisionsRequest,
                        context: grpc.ServicerContext) -> pb.ImportDecisionsResponse:
        self._service.require_writable()
        principal = current_principal()
        latest_ms = self._import_batch(request.decisions, "decision")
        search = PositionSearch(self._limits.batch_items)
        decisions = []
        for d in request.decisions:
            check_limit("a decision's rule_ids", len(d.rule_ids), MAX_DECISION_RULES,
                        "the decision format", reason="INVALID_DECISION")
            created_ms = _imported_ms(d.create_time, latest_ms,
                                      f"decision {d.decision_id[:80]!r}", "INVALID_DECISION")
            decisions.append(search.checked(Decision(
                decision_id=validate_identifier("decision_id", d.decision_id),
                fleet_id=target_fleet(principal, d.fleet_id),
                agent_id=validate_identifier("agent_id", d.agent_id),
                request_id=validate_request_id(d.request_id),
                position=d.position,
                record_id=validate_identifier("record_id", d.record_id),
                content_hash=d.content_hash, allowed=d.allowed,
                rule_ids=tuple(validate_identifier("rule_id", r) for r in d.rule_ids),
                reason=_bounded("reason", d.reason, 4000), created_ms=created_ms)))
        created, present = self._service.import_decisions(decisions, principal.agent_id)
        return pb.ImportDecisionsResponse(created=created, already_present=present)

    def RevokeToken(self, request: pb.RevokeTokenRequest,
                    context: grpc.ServicerContext) -> pb.RevokeTokenResponse:
        self._service.require_writable()
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id)
        jti = validate_identifier("jti", request.jti)
        if request.agent_id:
            validate_identifier("agent_id", request.agent_id)
        if not request.HasField("expire_time"):
            raise InvalidArgument("expire_time is required: the token's exp claim, so the "
                                  "revocation is kept exactly as long as the token could be "
                                  "used", reason="EXPIRE_TIME_REQUIRED")
        now_ms = self._service.now_ms()
        expires_ms = time_us(request.expire_time, "expire_time",
                             reason="INVALID_EXPIRE_TIME") // 1000
        if expires_ms > now_ms + MAX_TTL_SECONDS * 1000:
            raise InvalidArgument(f"expire_time is more than {MAX_TTL_SECONDS // 86400} days "
                                  "ahead; no token lives that long", reason="INVALID_EXPIRE_TIME")
        stored, created = self._service.revoke_token(TokenRevocation(
            jti=jti, fleet_id=fleet_id, agent_id=request.agent_id, expires_ms=expires_ms,
            revoked_ms=now_ms, revoked_by=principal.agent_id, reason=request.reason[:1000]))
        return pb.RevokeTokenResponse(revoked=revoked_token_to_proto(stored), created=created)

    def RevokeAgentTokens(self, request: pb.RevokeAgentTokensRequest,
                          context: grpc.ServicerContext) -> pb.RevokeAgentTokensResponse:
        self._service.require_writable()
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id)
        agent_id = validate_identifier("agent_id", request.agent_id)
        revocation = self._service.revoke_agent_tokens(fleet_id, agent_id, principal.agent_id,
                                                       request.reason[:1000])
        return pb.RevokeAgentTokensResponse(revoked=revoked_agent_to_proto(revocation))

    def RecordErasure(self, request: pb.RecordErasureRequest,
                      context: grpc.ServicerContext) -> pb.RecordErasureResponse:
        self._service.require_writable()
        principal = current_principal()
        fleet_id = target_fleet(principal, request.fleet_id)
        if request.request_id:
            validate_request_id(request.request_id)
        items = tuple(ErasedItem(i.kind, i.id, i.leaf_hash) for i in request.items)
        check_erasure(request.selector_kind, request.selector_value, request.reason, items)
        erasure = Erasure(
            # Keyed: an id anyone could derive from (fleet, request id) could be taken first
            # by another fleet's ImportErasures, or probed there for what this fleet erased.
            erasure_id=erasure_id_for(fleet_id, request.request_id and self._pages.derive(
                "erasure request", f"{fleet_id}\x00{request.request_id}")), fleet_id=fleet_id,
            selector_kind=request.selector_kind, selector_value=request.selector_value,
            requested_by=principal.agent_id, reason=request.reason, items=items,
            created_ms=self._service.now_ms())
        stored, created = self._service.record_erasure(erasure)
        if not created and (stored.fleet_id, stored.items) != (fleet_id, items):
            raise InvalidArgument(f"request_id {request.request_id!r} was already used for "
                                  "another erasure; use a new request_id",
                                  reason="REQUEST_ID_REUSED")
        return pb.RecordErasureResponse(erasure=erasure_to_proto(stored), created=created)

    def GetErasure(self, request: pb.GetErasureRequest,
                   context: grpc.ServicerContext) -> pb.GetErasureResponse:
        principal = current_principal()
        erasure_id = validate_identifier("erasure_id", request.erasure_id)
        found = self._service.erasure(erasure_id)
        # The services that erase read any fleet's (each checks the fleet against its own
        # caller's); people see their own fleet's only, and another fleet's look absent.
        erasing = any(is_caller(principal, kind) for kind in _ERASING)
        if found is None or (not erasing and found.fleet_id != principal.fleet_id):
            raise NotFound(f"no erasure {erasure_id!r} is recorded in this fleet",
                           reason="ERASURE_NOT_FOUND")
        return pb.GetErasureResponse(erasure=erasure_to_proto(found))

    def ListErasures(self, request: pb.ListErasuresRequest,
                     context: grpc.ServicerContext) -> pb.ListErasuresResponse:
        fleet_id = current_principal().fleet_id
        # An erasure lists up to 10,000 items (about 1 MB): a page stops at a byte budget too,
        # so it fits a client's 4 MiB message limit.
        page, token = self._pages.paginate(
            request.page_token, request.page_size, {"fleet_id": fleet_id, "list": "erasures"},
            lambda after, limit: [erasure_to_proto(e) for e in self._service.list_erasures(
                fleet_id, int(after[0]) if after else None, limit)],
            lambda erasure: [erasure.chain_seq], lambda erasure: erasure.ByteSize(),
            MAX_PAGE_BYTES)
        return pb.ListErasuresResponse(erasures=page, next_page_token=token)

    def ImportErasures(self, request: pb.ImportErasuresRequest,
                       context: grpc.ServicerContext) -> pb.ImportErasuresResponse:
        self._service.require_writable()
        principal = current_principal()
        latest_ms = self._import_batch(request.erasures, "erasure")
        erasures = []
        for e in request.erasures:
            erasure_id = check_erasure_id(e.erasure_id)
            items = tuple(ErasedItem(i.kind, i.id, i.leaf_hash) for i in e.items)
            check_erasure(e.selector_kind, e.selector_value, e.reason, items)
            created_ms = _imported_ms(e.create_time, latest_ms, f"erasure {erasure_id}",
                                      "INVALID_ERASURE")
            erasures.append(Erasure(
                erasure_id=erasure_id, fleet_id=target_fleet(principal, e.fleet_id),
                selector_kind=e.selector_kind, selector_value=e.selector_value,
                requested_by=validate_identifier("requested_by", e.requested_by),
                reason=e.reason, items=items, created_ms=created_ms))
        # Chained under the one head lock every fleet's gate decisions wait on: 40 erasures of
        # 10,000 items in one call held fleet B's erasure 4-6 s (found by review). Each
        # erasure was held to its own bound (ERASURE_TOO_LARGE) above.
        check_limit("the items of all erasures of one ImportErasures call",
                    sum(len(e.items) for e in erasures), MAX_ERASURE_ITEMS,
                    "a fixed limit: import in calls of fewer items", "items",
                    reason="IMPORT_TOO_LARGE")
        created, present = self._service.import_erasures(erasures, principal.agent_id)
        return pb.ImportErasuresResponse(created=created, already_present=present)

    def _import_batch(self, items: Sequence[Any], what: str) -> int:
        """An import call's items are 1..ENGRAM_LIMITS_BATCH_ITEMS; the latest time one of
        them may be dated (ms)."""
        if not items:
            raise InvalidArgument(f"send at least one {what}", reason="EMPTY_BATCH")
        check_limit(f"{what}s", len(items), self._limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS", reason="BATCH_TOO_LARGE")
        return self._service.now_ms() + MAX_CLOCK_SKEW_US // 1000

    def ListAccessRestrictions(self, request: pb.ListAccessRestrictionsRequest,
                               context: grpc.ServicerContext
                               ) -> pb.ListAccessRestrictionsResponse:
        snapshot = self._service.access_snapshot(request.since_version)
        if snapshot is None:
            return pb.ListAccessRestrictionsResponse(version=request.since_version,
                                                     changed=False)
        return pb.ListAccessRestrictionsResponse(
            version=snapshot.version, changed=True,
            # Keys and times only: what a service enforces (restrictions_from_proto). The
            # reasons (up to 4,000 bytes each) went to every service on every change.
            revoked_tokens=[pb.RevokedToken(fleet_id=t.fleet_id, jti=t.jti,
                                            expire_time=_timestamp(t.expires_ms))
                            for t in snapshot.tokens],
            revoked_agents=[pb.RevokedAgent(fleet_id=a.fleet_id, agent_id=a.agent_id,
                                            issued_before=_timestamp(a.issued_before_s * 1000))
                            for a in snapshot.agents],
            suspended_agents=[pb.AgentRef(fleet_id=f, agent_id=a) for f, a in snapshot.suspended])


def _imported_ms(created: Timestamp, latest_ms: int, what: str, reason: str) -> int:
    """An imported item's creation time (ms), refused outside 0001..9999 or when dated past
    ``latest_ms``: it would count in every rate window from now on."""
    created_ms = time_us(created, "create_time", reason=reason) // 1000
    if created_ms > latest_ms:
        raise InvalidArgument(f"{what} is dated in the future", reason=reason)
    return created_ms


MAX_PAGE_BYTES = 3 * 1024 * 1024
"""What one ListErasures page holds at most (one erasure always goes)."""


def erasure_to_proto(erasure: Erasure) -> pb.Erasure:
    return pb.Erasure(
        erasure_id=erasure.erasure_id, fleet_id=erasure.fleet_id,
        selector_kind=erasure.selector_kind, selector_value=erasure.selector_value,
        requested_by=erasure.requested_by, reason=erasure.reason,
        items=[pb.ErasedItem(kind=i.kind, id=i.id, leaf_hash=i.leaf_hash)
               for i in erasure.items],
        create_time=_timestamp(erasure.created_ms), chain_seq=erasure.chain_seq,
        imported=erasure.imported)


def add_to_server(servicer: GovernanceServicer, server: grpc.Server) -> None:
    pb_grpc.add_GovernanceServiceServicer_to_server(servicer, server)
