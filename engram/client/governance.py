"""Python SDK for the governance service.

    with GovernanceClient(settings.governance_addr, settings.resolve_token()) as gov:
        gov.set_tier("agent-7", "suspended", reason="poisoned the people domain")
        gov.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="ignore (all )?previous")))
        print(gov.verify_chain().ok)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from functools import cached_property

from engram.client._channel import BaseClient, idempotency_key, string_list
from engram.governance.v1 import governance_service_pb2 as pb
from engram.governance.v1 import governance_service_pb2_grpc as pb_grpc

TIERS = {
    "trusted": pb.TRUST_TIER_TRUSTED,
    "standard": pb.TRUST_TIER_STANDARD,
    "probation": pb.TRUST_TIER_PROBATION,
    "suspended": pb.TRUST_TIER_SUSPENDED,
}
TIER_NAMES = {value: name for name, value in TIERS.items()}


def tier_value(name: str) -> pb.TrustTier:
    try:
        return TIERS[name.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown tier {name!r}; choose one of {', '.join(TIERS)}") from None


class GovernanceClient(BaseClient):
    """``GovernanceClient(target, token)``; every method raises ``EngramRpcError`` on failure."""

    @cached_property
    def stub(self) -> pb_grpc.GovernanceServiceStub:
        return pb_grpc.GovernanceServiceStub(self.channel)

    def decide(self, fleet_id: str, agent_id: str, request_id: str,
               candidates: Iterable[pb.WriteCandidate], *,
               neighbours_omitted: bool = False) -> pb.DecideWritesResponse:
        """The write gate (service principals only)."""
        request = pb.DecideWritesRequest(fleet_id=fleet_id, agent_id=agent_id,
                                         request_id=request_id, candidates=list(candidates),
                                         neighbours_omitted=neighbours_omitted)
        return self.call(self.stub.DecideWrites, request)

    def decide_batches(self, requests: Sequence[pb.DecideWritesRequest]
                       ) -> pb.DecideWriteBatchesResponse:
        """Several gate requests in one call (service principals only): one result each."""
        return self.call(self.stub.DecideWriteBatches,
                         pb.DecideWriteBatchesRequest(requests=list(requests)))

    def trust(self, agent_id: str = "", *, fleet_id: str = "") -> pb.AgentTrust:
        request = pb.GetTrustRequest(fleet_id=fleet_id, agent_id=agent_id)
        return self.call(self.stub.GetTrust, request).trust

    def trusts(self, fleet_id: str, agent_ids: Sequence[str]) -> list[pb.AgentTrust]:
        request = pb.BatchGetTrustRequest(fleet_id=fleet_id,
                                          agent_ids=string_list("agent_ids", agent_ids))
        return list(self.call(self.stub.BatchGetTrust, request).trusts)

    def set_tier(self, agent_id: str, tier: str, *, reason: str = "",
                 fleet_id: str = "") -> pb.AgentTrust:
        request = pb.SetTierRequest(fleet_id=fleet_id, agent_id=agent_id,
                                    tier=tier_value(tier), reason=reason)
        return self.call(self.stub.SetTier, request).trust

    def add_rule(self, rule: pb.Rule, *, request_id: str = "") -> pb.CreateRuleResponse:
        return self.call(self.stub.CreateRule,
                         pb.CreateRuleRequest(rule=rule, request_id=idempotency_key(request_id)))

    def rules(self, *, fleet_id: str = "", page_size: int = 0) -> Iterator[pb.Rule]:
        """Every rule of the fleet, following page tokens."""
        request = pb.ListRulesRequest(fleet_id=fleet_id, page_size=page_size)
        return self.paginate(self.stub.ListRules, request, lambda reply: reply.rules)

    def remove_rule(self, rule_id: str, *, fleet_id: str = "") -> None:
        self.call(self.stub.DeleteRule, pb.DeleteRuleRequest(rule_id=rule_id, fleet_id=fleet_id))

    def decisions(self, *, agent_id: str = "", fleet_id: str = "",
                  page_size: int = 0) -> Iterator[pb.GateDecision]:
        """Recorded gate decisions, newest first, following page tokens."""
        request = pb.ListDecisionsRequest(fleet_id=fleet_id, agent_id=agent_id,
                                          page_size=page_size)
        return self.paginate(self.stub.ListDecisions, request, lambda reply: reply.decisions)

    def decisions_by_id(self, decision_ids: Sequence[str], *,
                        fleet_id: str = "") -> list[pb.GateDecision]:
        """Recorded decisions by id (governors); unknown ids are left out."""
        request = pb.BatchGetDecisionsRequest(fleet_id=fleet_id, decision_ids=list(decision_ids))
        return list(self.call(self.stub.BatchGetDecisions, request).decisions)

    def import_decisions(self, decisions: Sequence[pb.GateDecision]
                         ) -> pb.ImportDecisionsResponse:
        """Decisions another governance recorded, kept as they were (admin; import-bundle)."""
        reply: pb.ImportDecisionsResponse = self.call(
            self.stub.ImportDecisions, pb.ImportDecisionsRequest(decisions=decisions))
        return reply

    def checkpoint(self) -> pb.ChainCheckpoint:
        return self.call(self.stub.GetChainCheckpoint,
                         pb.GetChainCheckpointRequest()).checkpoint

    def verify_chain(self, since: pb.ChainCheckpoint | None = None) -> pb.VerifyChainResponse:
        return self.call(self.stub.VerifyChain, pb.VerifyChainRequest(since=since))

    def verify_extends(self, checkpoint: pb.ChainCheckpoint, later: pb.ChainCheckpoint) -> bool:
        """Whether ``later`` extends the ``checkpoint`` this client holds (no history rewritten).

        Both must be prefixes of a chain that verifies: a rolled-back or forked chain, or a
        head the service cannot show as a prefix, is False.
        """
        if later.length < checkpoint.length:
            return False
        if later.length == checkpoint.length:
            return later.head == checkpoint.head and self._holds(later)
        return self._holds(checkpoint) and self._holds(later)

    def _holds(self, checkpoint: pb.ChainCheckpoint) -> bool:
        report = self.verify_chain(since=checkpoint)
        return bool(report.ok and report.extends_since)

    def revoke_token(self, jti: str, expire_time: datetime, *, fleet_id: str = "",
                     agent_id: str = "", reason: str = "") -> pb.RevokeTokenResponse:
        """Revoke one token (governor role); ``expire_time`` is the token's own exp."""
        request = pb.RevokeTokenRequest(jti=jti, fleet_id=fleet_id, agent_id=agent_id,
                                        reason=reason)
        request.expire_time.FromDatetime(expire_time)
        return self.call(self.stub.RevokeToken, request)

    def revoke_agent_tokens(self, agent_id: str, *, fleet_id: str = "",
                            reason: str = "") -> pb.RevokedAgent:
        """Revoke every token of ``agent_id`` issued up to now (governor role)."""
        request = pb.RevokeAgentTokensRequest(fleet_id=fleet_id, agent_id=agent_id,
                                              reason=reason)
        return self.call(self.stub.RevokeAgentTokens, request).revoked

    def record_erasure(self, selector_kind: str, selector_value: str,
                       items: Iterable[pb.ErasedItem], *, reason: str = "", fleet_id: str = "",
                       request_id: str = "") -> pb.RecordErasureResponse:
        """Chain an erasure (governor role); a retry with the same request_id (one is made
        when none is given) returns the erasure it recorded."""
        request = pb.RecordErasureRequest(
            fleet_id=fleet_id, selector_kind=selector_kind, selector_value=selector_value,
            reason=reason, items=list(items), request_id=idempotency_key(request_id))
        return self.call(self.stub.RecordErasure, request)

    def erasure(self, erasure_id: str) -> pb.Erasure:
        return self.call(self.stub.GetErasure, pb.GetErasureRequest(erasure_id=erasure_id)).erasure

    def erasures(self, *, page_size: int = 0) -> Iterator[pb.Erasure]:
        """The fleet's recorded erasures, oldest first, following page tokens (governors)."""
        return self.paginate(self.stub.ListErasures, pb.ListErasuresRequest(page_size=page_size),
                             lambda reply: reply.erasures)

    def import_erasures(self, erasures: Sequence[pb.Erasure]) -> pb.ImportErasuresResponse:
        """Erasures another governance recorded, kept as they were (admin; import-bundle)."""
        reply: pb.ImportErasuresResponse = self.call(
            self.stub.ImportErasures, pb.ImportErasuresRequest(erasures=erasures))
        return reply

    def access_restrictions(self, since_version: int = 0) -> pb.ListAccessRestrictionsResponse:
        """Revoked tokens and agents and suspended agents (service principals only)."""
        return self.call(self.stub.ListAccessRestrictions,
                         pb.ListAccessRestrictionsRequest(since_version=since_version))
