"""`engram verify --gate`'s reconciliation: each way a record can lack an allowing decision."""

from __future__ import annotations

from engram.client.gate_audit import reconcile
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb

RECORD = spb.Record(id="rec-1", fleet_id="f", agent_id="a", content_hash="h1",
                    gate_decision_id="dec-1")
ALLOWED = gpb.GateDecision(decision_id="dec-1", allowed=True, fleet_id="f", agent_id="a",
                           record_id="rec-1", content_hash="h1")


def test_an_allowing_decision_for_this_record_reconciles() -> None:
    assert reconcile(RECORD, ALLOWED) is None


def test_each_mismatch_is_named() -> None:
    ungated = spb.Record(id="rec-2", fleet_id="f", agent_id="a", content_hash="h2")
    cases = {
        "ungated": reconcile(ungated, None),
        "no record of": reconcile(RECORD, None),
        "denied it (too big)": reconcile(RECORD, gpb.GateDecision(
            decision_id="dec-1", allowed=False, reason="too big", fleet_id="f", agent_id="a",
            record_id="rec-1", content_hash="h1")),
        "another write (record rec-9 by b)": reconcile(RECORD, gpb.GateDecision(
            decision_id="dec-1", allowed=True, fleet_id="f", agent_id="b", record_id="rec-9",
            content_hash="h1")),
    }
    for words, problem in cases.items():
        assert problem is not None and words in problem.detail, words
    assert cases["ungated"] is not None and cases["ungated"].decision_id == ""
