"""Gate calls and rule creation retried concurrently: every caller gets the first answer."""

from __future__ import annotations

from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from tests.integration.governance.conftest import GovClientFactory
from tests.integration.governance.test_contract import candidate
from tests.integration.races import at_once


def test_concurrent_decide_with_one_request_id_records_one_decision(
        gov_for: GovClientFactory, governor: GovernanceClient) -> None:
    shards = [gov_for("svc-shard", "system", ("service",)) for _ in range(4)]
    calls = iter(range(10**6))

    def decide() -> pb.DecideWritesResponse:
        return shards[next(calls) % len(shards)].decide(
            "fleet-a", "agent-1", "req-race", [candidate("Concurrent retries of one write")])

    results = at_once(decide)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    ids = {r.decisions[0].decision_id for r in results if isinstance(r, pb.DecideWritesResponse)}
    assert len(ids) == 1
    assert len(list(governor.decisions(agent_id="agent-1"))) == 1


def test_concurrent_create_rule_with_one_request_id_creates_one_rule(
        gov_for: GovClientFactory, governor: GovernanceClient) -> None:
    governors = [gov_for() for _ in range(4)]
    calls = iter(range(10**6))
    rule = pb.Rule(deny_pattern=pb.DenyPattern(pattern="hunter2"))

    def create() -> pb.CreateRuleResponse:
        return governors[next(calls) % len(governors)].add_rule(rule, request_id="rule-race")

    results = at_once(create)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert len({r.rule.rule_id for r in results if isinstance(r, pb.CreateRuleResponse)}) == 1
    assert sum(r.created for r in results if isinstance(r, pb.CreateRuleResponse)) == 1
    assert len(list(governor.rules())) == 1
