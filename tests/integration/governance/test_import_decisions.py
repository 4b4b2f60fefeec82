"""ImportDecisions between two real governance servers (SQLite or Postgres at the origin): gate
decisions move as they were, chained here as imported entries that the full verification
replays; they move no trust; importing twice changes nothing; admin of the same fleet only;
an id that does not derive from its content, a conflict or an unbounded call is refused with
nothing stored."""

from __future__ import annotations

import grpc
import pytest

from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.server import EngramServer
from services.governance.domain.decisions import decision_id
from tests.conftest import TokenFactory
from tests.integration.governance.conftest import admin, refused
from tests.integration.governance.test_contract import candidate


@pytest.fixture
def exported(shard_service: GovernanceClient, governor: GovernanceClient) -> list[pb.GateDecision]:
    """Three allowed decisions and one denial at the origin, as an export lists them."""
    governor.add_rule(pb.Rule(fleet_id="fleet-a", description="no secrets",
                              deny_pattern=pb.DenyPattern(pattern="password[:=]")))
    shard_service.decide("fleet-a", "agent-1", "req-1",
                         [candidate("Retries need idempotency keys"),
                          candidate("Deploys happen on Tuesdays")])
    shard_service.decide("fleet-a", "agent-2", "req-2", [candidate("the password: hunter2"),
                                                         candidate("Tuesday is deploy day")])
    decisions = list(governor.decisions())
    assert sorted(d.allowed for d in decisions) == [False, True, True, True]
    return decisions


def _without_seq(decisions: list[pb.GateDecision]) -> list[pb.GateDecision]:
    out = []
    for decision in decisions:
        copy = pb.GateDecision()
        copy.CopyFrom(decision)
        copy.ClearField("chain_seq")
        out.append(copy)
    return sorted(out, key=lambda d: d.decision_id)


def test_decisions_move_as_they_were_and_the_chain_replays_them(
        exported: list[pb.GateDecision], target: EngramServer,
        make_token: TokenFactory) -> None:
    with admin(target, make_token) as client:
        first = client.import_decisions(exported)
        again = client.import_decisions(exported)
        assert (first.created, first.already_present) == (4, 0)
        assert (again.created, again.already_present) == (0, 4)
        here = client.decisions_by_id([d.decision_id for d in exported])
        assert _without_seq(here) == _without_seq(exported)
        assert sorted(d.chain_seq for d in here) == [0, 1, 2, 3]  # this chain's own entries
        report = client.verify_chain()  # the whole chain, replayed against the state tables
        assert report.ok, report
        # Imported decisions are history, not behaviour: no trust moved here.
        assert not client.trust("agent-2").pinned
        assert client.trust("agent-2").score == client.trust("never-seen").score


def test_a_decision_exported_without_its_position_still_derives(
        exported: list[pb.GateDecision], target: EngramServer,
        make_token: TokenFactory) -> None:
    second = next(d for d in exported if d.position == 1)
    old = pb.GateDecision()
    old.CopyFrom(second)
    old.ClearField("position")  # a bundle from before positions were carried
    with admin(target, make_token) as client:
        assert client.import_decisions([old]).created == 1
        assert client.decisions_by_id([old.decision_id])[0].position == 1


def test_only_an_admin_of_the_fleet_imports(
        exported: list[pb.GateDecision], target: EngramServer,
        make_token: TokenFactory) -> None:
    for role in ("agent", "governor"):
        with admin(target, make_token, role=role) as client:
            assert refused(client.import_decisions, exported).code == \
                grpc.StatusCode.PERMISSION_DENIED
    with admin(target, make_token, "fleet-b") as other:
        error = refused(other.import_decisions, exported)
        assert (error.code, error.reason) == (grpc.StatusCode.PERMISSION_DENIED,
                                              "FLEET_MISMATCH")
    with admin(target, make_token) as client:
        assert client.checkpoint().length == 0


def test_forged_conflicting_and_unbounded_imports_are_refused(
        exported: list[pb.GateDecision], target: EngramServer,
        make_token: TokenFactory) -> None:
    def altered(decision: pb.GateDecision, **fields: object) -> pb.GateDecision:
        copy = pb.GateDecision()
        copy.CopyFrom(decision)
        for name, value in fields.items():
            if name == "rule_ids":
                copy.rule_ids[:] = value  # type: ignore[assignment]
            else:
                setattr(copy, name, value)
        return copy

    allowed = next(d for d in exported if d.allowed)
    with admin(target, make_token) as client:
        client.import_decisions([allowed])
        for items, code, reason in (
                ([altered(allowed, request_id="req-9")], grpc.StatusCode.INVALID_ARGUMENT,
                 "DECISION_ID_MISMATCH"),
                ([altered(allowed, content_hash="abc")], grpc.StatusCode.INVALID_ARGUMENT,
                 "INVALID_DECISION"),
                ([altered(allowed, rule_ids=["rule-1"])], grpc.StatusCode.INVALID_ARGUMENT,
                 "INVALID_DECISION"),
                # Another outcome under a recorded id: never rewritten, and the whole call
                # (with a decision that alone would be new) stores nothing.
                ([*[d for d in exported if d.decision_id != allowed.decision_id],
                  altered(allowed, allowed=False, rule_ids=["rule-1"])],
                 grpc.StatusCode.ALREADY_EXISTS, "DECISION_CONFLICT"),
                ([], grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_BATCH"),
                ([allowed] * 1001, grpc.StatusCode.INVALID_ARGUMENT, "BATCH_TOO_LARGE")):
            error = refused(client.import_decisions, items)
            assert (error.code, error.reason) == (code, reason), (reason, error.message)
        assert client.checkpoint().length == 1
        assert client.verify_chain().ok


def test_an_import_cannot_date_decisions_ahead_flood_rules_or_burn_the_gate_s_cpu(
        exported: list[pb.GateDecision], target: EngramServer,
        make_token: TokenFactory) -> None:
    """A decision dated in 9999 counted in every rate window from then on (an agent's writes
    refused for good); a decision could name megabytes of rules; and decisions whose position
    was left out made the gate's process search 1,000 positions each (about 1 s a call)."""
    allowed = next(d for d in exported if d.allowed)
    denied = next(d for d in exported if not d.allowed)
    with admin(target, make_token) as client:
        ahead = pb.GateDecision()
        ahead.CopyFrom(allowed)
        ahead.create_time.seconds = 253_402_300_000
        flooded = pb.GateDecision()
        flooded.CopyFrom(denied)
        flooded.rule_ids.extend(f"rule-{n}" for n in range(64))
        far = pb.GateDecision()
        far.CopyFrom(allowed)
        far.create_time.seconds = 2**40
        for bad in (ahead, flooded, far):
            error = refused(client.import_decisions, [bad])
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                  "INVALID_DECISION"), error.message
        hidden = []
        for n in range(30):  # real ids at the last position, each sent without it
            decision = pb.GateDecision()
            decision.CopyFrom(allowed)
            decision.request_id = f"req-far-{n}"
            decision.decision_id = decision_id("fleet-a", allowed.agent_id, decision.request_id,
                                               999)
            decision.ClearField("position")
            hidden.append(decision)
        error = refused(client.import_decisions, hidden)
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                              "DECISION_POSITION_MISSING")
        assert client.import_decisions(hidden[:15]).created == 15  # within the budget
        assert client.checkpoint().length == 15
