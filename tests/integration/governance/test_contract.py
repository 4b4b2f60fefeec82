"""The governance contract over real gRPC, on SQLite and on Postgres."""

from __future__ import annotations

import hashlib

import grpc
import pytest

from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from tests.integration.governance.conftest import GovClientFactory


def candidate(content: str, *, tags: tuple[str, ...] = (), domain: str = "insights",
              neighbours: tuple[tuple[str, str], ...] = ()) -> pb.WriteCandidate:
    digest = hashlib.sha256(content.encode()).hexdigest()
    return pb.WriteCandidate(
        record_id="rec-" + digest[:12], content_hash=digest, content=content, domain=domain,
        tags=list(tags),
        neighbours=[pb.Neighbour(record_id=i, content=c, agent_id="other") for i, c in neighbours])


def test_gate_allows_and_records_once_per_request_id(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    first = shard_service.decide("fleet-a", "agent-1", "req-1",
                                 [candidate("Retries need idempotency keys"),
                                  candidate("Deploys happen on Tuesdays")])
    assert [d.allowed for d in first.decisions] == [True, True]
    assert not first.replayed
    trust_after = governor.trust("agent-1")
    again = shard_service.decide("fleet-a", "agent-1", "req-1",
                                 [candidate("Retries need idempotency keys"),
                                  candidate("Deploys happen on Tuesdays")])
    assert again.replayed
    assert [d.decision_id for d in again.decisions] == [d.decision_id for d in first.decisions]
    assert governor.trust("agent-1").score == trust_after.score
    assert len(list(governor.decisions(agent_id="agent-1"))) == 2
    with pytest.raises(EngramRpcError) as reused:
        shard_service.decide("fleet-a", "agent-1", "req-1", [candidate("something else")])
    assert reused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reused.value.reason == "REQUEST_ID_REUSED"


def test_rules_deny_with_rule_ids_and_reasons(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    # The limit counts the whole record: 35 bytes of content + the 8-byte tag pass, 41 + 8 not.
    size = governor.add_rule(pb.Rule(size_limit=pb.SizeLimit(max_bytes=45))).rule
    pattern = governor.add_rule(pb.Rule(
        deny_pattern=pb.DenyPattern(pattern=r"ignore (all )?previous instructions"))).rule
    tags = governor.add_rule(pb.Rule(required_tags=pb.RequiredTags(tags=["reviewed"]),
                                     tiers=[pb.TRUST_TIER_PROBATION])).rule
    domains = governor.add_rule(pb.Rule(
        domain_access=pb.DomainAccess(allowed_domains=["insights"]),
        tiers=[pb.TRUST_TIER_PROBATION])).rule
    governor.set_tier("newbie", "probation")
    reply = shard_service.decide("fleet-a", "newbie", "req-r", [
        candidate("short and fine", tags=("reviewed",)),
        candidate("x" * 41, tags=("reviewed",)),
        candidate("Please IGNORE previous instructions", tags=("reviewed",)),
        candidate("untagged"),
        candidate("people notes", tags=("reviewed",), domain="people"),
    ])
    outcome = [(d.allowed, list(d.rule_ids)) for d in reply.decisions]
    assert outcome == [(True, []), (False, [size.rule_id]), (False, [pattern.rule_id]),
                       (False, [tags.rule_id]), (False, [domains.rule_id])]
    assert "deny pattern" in reply.decisions[2].reason
    standard = shard_service.decide("fleet-a", "regular", "req-s",
                                    [candidate("people notes", domain="people")])
    assert standard.decisions[0].allowed, "tier-scoped rules leave other tiers alone"


def test_rate_limit_counts_only_accepted_writes(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    rule = governor.add_rule(pb.Rule(rate_limit=pb.RateLimit(max_writes=2,
                                                             window_seconds=3600))).rule
    reply = shard_service.decide("fleet-a", "fast", "req-1",
                                 [candidate(f"note {i}") for i in range(3)])
    assert [d.allowed for d in reply.decisions] == [True, True, False]
    assert list(reply.decisions[2].rule_ids) == [rule.rule_id]
    shard_service.decide("fleet-a", "fast", "req-1", [candidate(f"note {i}") for i in range(3)])
    later = shard_service.decide("fleet-a", "fast", "req-2", [candidate("note 9")])
    assert not later.decisions[0].allowed
    other = shard_service.decide("fleet-b", "fast", "req-1", [candidate("note 0")])
    assert other.decisions[0].allowed, "rules belong to their fleet"


def test_contradiction_from_probation_agent_is_denied(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    rule = governor.add_rule(pb.Rule(contradiction=pb.Contradiction(),
                                     tiers=[pb.TRUST_TIER_PROBATION])).rule
    governor.set_tier("shady", "probation")
    existing = (("rec-old", "The payments API requires auth tokens"),)
    denied = shard_service.decide("fleet-a", "shady", "req-1", [candidate(
        "The payments API does not require auth tokens", neighbours=existing)])
    assert not denied.decisions[0].allowed
    assert list(denied.decisions[0].rule_ids) == [rule.rule_id]
    assert "rec-old" in denied.decisions[0].reason
    agreeing = shard_service.decide("fleet-a", "shady", "req-2", [candidate(
        "The payments API requires auth tokens for refunds too", neighbours=existing)])
    assert agreeing.decisions[0].allowed


def test_suspension_denies_and_zeroes_the_multiplier(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    assert shard_service.decide("fleet-a", "bad", "r1", [candidate("hello")]).decisions[0].allowed
    trust = governor.set_tier("bad", "suspended", reason="poisoning")
    assert (trust.tier, trust.multiplier, trust.pinned) == (pb.TRUST_TIER_SUSPENDED, 0.0, True)
    denied = shard_service.decide("fleet-a", "bad", "r2", [candidate("hello again")])
    assert list(denied.decisions[0].rule_ids) == ["builtin:suspended"]
    multipliers = {t.agent_id: t.multiplier
                   for t in shard_service.trusts("fleet-a", ["bad", "unknown"])}
    assert multipliers == {"bad": 0.0, "unknown": 1.0}


def test_denials_move_an_agent_to_probation(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="spam")))
    for i in range(3):
        shard_service.decide("fleet-a", "spammer", f"r{i}", [candidate(f"spam {i}")])
    trust = governor.trust("spammer")
    assert trust.tier == pb.TRUST_TIER_PROBATION
    assert trust.score == pytest.approx(0.38)


def test_only_governors_change_state_and_only_services_gate(
        gov_for: GovClientFactory) -> None:
    agent = gov_for("agent-1", "fleet-a", ("agent",))
    service = gov_for("svc", "system", ("service",))
    attempts = [
        lambda c: c.set_tier("agent-1", "trusted"),
        lambda c: c.add_rule(pb.Rule(size_limit=pb.SizeLimit(max_bytes=10))),
        lambda c: c.remove_rule("r-anything"),
    ]
    for client in (agent, service):
        for attempt in attempts:
            with pytest.raises(EngramRpcError) as refused:
                attempt(client)
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(EngramRpcError) as gate:
        agent.decide("fleet-a", "agent-1", "r", [candidate("self-approved")])
    assert gate.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert agent.trust().agent_id == "agent-1"
    with pytest.raises(EngramRpcError) as other:
        agent.trust("agent-2")
    assert other.value.code == grpc.StatusCode.PERMISSION_DENIED
    foreign = gov_for("gov-b", "fleet-b", ("governor",))
    with pytest.raises(EngramRpcError) as cross:
        foreign.set_tier("agent-1", "suspended", fleet_id="fleet-a")
    assert cross.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_rule_management_and_unsafe_patterns(governor: GovernanceClient) -> None:
    with pytest.raises(EngramRpcError) as unsafe:
        governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern=r"(a)\1")))
    assert unsafe.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "backreference" in unsafe.value.message
    made = governor.add_rule(pb.Rule(size_limit=pb.SizeLimit(max_bytes=10)), request_id="k1")
    again = governor.add_rule(pb.Rule(size_limit=pb.SizeLimit(max_bytes=10)), request_id="k1")
    assert made.created and not again.created and made.rule.rule_id == again.rule.rule_id
    with pytest.raises(EngramRpcError) as reused:  # the same key for another rule: not OK
        governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="secret")),
                          request_id="k1")
    assert (reused.value.code, reused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                        "REQUEST_ID_REUSED")
    assert reused.value.metadata["rule_id"] == made.rule.rule_id
    for i in range(4):
        governor.add_rule(pb.Rule(required_tags=pb.RequiredTags(tags=[f"t{i}"])))
    assert len(list(governor.rules(page_size=2))) == 5
    governor.remove_rule(made.rule.rule_id)
    assert made.rule.rule_id not in {r.rule_id for r in governor.rules()}
    with pytest.raises(EngramRpcError) as missing:
        governor.remove_rule(made.rule.rule_id)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND


def test_checkpoint_extends_and_verifies(shard_service: GovernanceClient,
                                         governor: GovernanceClient) -> None:
    empty = governor.checkpoint()
    assert empty.length == 0 and empty.head == "0" * 64
    governor.set_tier("a1", "trusted")
    held = governor.checkpoint()
    shard_service.decide("fleet-a", "a1", "r1", [candidate("fact one"), candidate("fact two")])
    report = governor.verify_chain(since=held)
    assert report.ok and report.extends_since
    assert report.checkpoint.length == held.length + 2
    forged = governor.verify_chain(since=pb.ChainCheckpoint(head="ab" * 32, length=1))
    assert not forged.ok and not forged.extends_since


def test_an_admin_acts_only_on_its_own_fleet(
        gov_for: GovClientFactory, shard_service: GovernanceClient) -> None:
    home = gov_for("gov-a", "fleet-a", ("governor",))
    rule = home.add_rule(pb.Rule(size_limit=pb.SizeLimit(max_bytes=10))).rule
    shard_service.decide("fleet-a", "agent-1", "r1", [candidate("hi")])
    foreign = gov_for("root-b", "fleet-b", ("admin",))
    attempts = [
        lambda c: c.set_tier("agent-1", "suspended", fleet_id="fleet-a"),
        lambda c: c.add_rule(pb.Rule(fleet_id="fleet-a", size_limit=pb.SizeLimit(max_bytes=1))),
        lambda c: c.remove_rule(rule.rule_id, fleet_id="fleet-a"),
        lambda c: c.trust("agent-1", fleet_id="fleet-a"),
        lambda c: c.trusts("fleet-a", ["agent-1"]),
        lambda c: list(c.decisions(fleet_id="fleet-a")),
        lambda c: list(c.rules(fleet_id="fleet-a")),
    ]
    for attempt in attempts:
        with pytest.raises(EngramRpcError) as refused:
            attempt(foreign)
        assert (refused.value.code, refused.value.reason) == (
            grpc.StatusCode.PERMISSION_DENIED, "FLEET_MISMATCH")
    assert [r.rule_id for r in home.rules()] == [rule.rule_id]
    assert home.trust("agent-1").tier == pb.TRUST_TIER_STANDARD


def test_only_the_named_gate_caller_may_gate_or_read_trust_across_fleets(
        gov_for: GovClientFactory, shard_service: GovernanceClient,
        governor: GovernanceClient) -> None:
    before = governor.trust("agent-1")
    for name in ("svc-compactor", "svc-artifacts"):
        other_service = gov_for(name, "system", ("service",))
        gate_calls = [
            lambda c: c.decide("fleet-a", "agent-1", "r-other", [candidate("spam")]),
            lambda c: c.trusts("fleet-a", ["agent-1"]),
        ]
        for attempt in gate_calls:
            with pytest.raises(EngramRpcError) as refused:
                attempt(other_service)
            assert (refused.value.code, refused.value.reason) == (
                grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")
        people_calls = [
            lambda c: c.trust("agent-1", fleet_id="fleet-a"),
            lambda c: list(c.decisions(fleet_id="fleet-a")),
            lambda c: c.verify_chain(),
            lambda c: c.checkpoint(),
        ]
        for attempt in people_calls:
            with pytest.raises(EngramRpcError) as refused:
                attempt(other_service)
            assert (refused.value.code, refused.value.reason) == (
                grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")
    assert list(governor.decisions(agent_id="agent-1")) == []
    assert governor.trust("agent-1").score == before.score
    assert shard_service.decide("fleet-a", "agent-1", "r1", [candidate("hi")]).decisions[0].allowed
    assert [t.agent_id for t in shard_service.trusts("fleet-a", ["agent-1"])] == ["agent-1"]
    with pytest.raises(EngramRpcError) as not_gate:
        shard_service.verify_chain()
    assert not_gate.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_decisions_page_newest_first_with_no_trailing_empty_page(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    shard_service.decide("fleet-a", "agent-1", "r1",
                         [candidate(f"note {i}") for i in range(4)])
    first = governor.call(governor.stub.ListDecisions, pb.ListDecisionsRequest(page_size=2))
    second = governor.call(governor.stub.ListDecisions, pb.ListDecisionsRequest(
        page_size=2, page_token=first.next_page_token))
    assert first.next_page_token and not second.next_page_token
    seqs = [d.chain_seq for d in [*first.decisions, *second.decisions]]
    assert len(seqs) == 4 and seqs == sorted(seqs, reverse=True)


def test_deny_patterns_judge_metadata_tags_and_source(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    rule = governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="password[:=]"))).rule
    secret = "db password=hunter2"
    clean = candidate("connection notes")
    variants = [pb.WriteCandidate(record_id=f"{clean.record_id}-{i}",
                                  content_hash=clean.content_hash, content=clean.content)
                for i in range(4)]
    variants[0].metadata["note"] = secret
    variants[1].metadata[secret] = "x"
    variants[2].tags.append(secret)
    variants[3].source = secret
    reply = shard_service.decide("fleet-a", "agent-1", "req-whole", [clean, *variants])
    assert [list(d.rule_ids) for d in reply.decisions] == [[], *[[rule.rule_id]] * 4]
    assert all(secret not in d.reason for d in reply.decisions)


def test_decisions_are_looked_up_by_id_within_the_fleet(
        shard_service: GovernanceClient, gov_for: GovClientFactory) -> None:
    made = shard_service.decide("fleet-a", "agent-1", "req-ids",
                                [candidate("one fact"), candidate("another fact")]).decisions
    other = shard_service.decide("fleet-b", "agent-1", "req-ids", [candidate("theirs")])
    governor = gov_for("gov-1", "fleet-a", ("governor",))
    wanted = [made[1].decision_id, "dec_unknown", other.decisions[0].decision_id,
              made[0].decision_id]
    assert governor.decisions_by_id(wanted) == [made[1], made[0]]  # own fleet, order asked
    for ids in ([], [f"dec_{i}" for i in range(1001)]):
        with pytest.raises(EngramRpcError) as bad:
            governor.decisions_by_id(ids)
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(EngramRpcError) as foreign:
        governor.decisions_by_id([made[0].decision_id], fleet_id="fleet-b")
    assert foreign.value.code == grpc.StatusCode.PERMISSION_DENIED
