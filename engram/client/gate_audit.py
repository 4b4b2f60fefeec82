"""Reconcile stored memory records against governance's recorded gate decisions.

Every record a gated shard stores carries the id of the decision that allowed
it (``Record.gate_decision_id``, under ``record_hash``). :func:`audit_gate`
reads the fleet's records from the shard and those decisions from governance
(``BatchGetDecisions``, governor or admin) and names every record that has no
decision, whose decision is unknown to governance, denied it, or was made for
another record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice

from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb

LOOKUP_BATCH = 1000


@dataclass(frozen=True)
class GateProblem:
    record_id: str
    decision_id: str
    detail: str


@dataclass(frozen=True)
class GateAudit:
    checked: int
    problems: list[GateProblem]

    @property
    def ok(self) -> bool:
        return not self.problems


def reconcile(record: spb.Record, decision: gpb.GateDecision | None) -> GateProblem | None:
    """What is wrong between one record and the decision it names; None when they agree."""
    did = record.gate_decision_id
    if not did:
        return GateProblem(record.id, "", f"record {record.id} has no gate decision: it was "
                           "stored by a shard running ungated (ENGRAM_SHARD_ALLOW_UNGATED) or "
                           "before decisions were recorded")
    if decision is None:
        return GateProblem(record.id, did, f"record {record.id} names gate decision {did}, "
                           "which governance has no record of")
    if not decision.allowed:
        return GateProblem(record.id, did, f"record {record.id} is stored although gate "
                           f"decision {did} denied it ({decision.reason})")
    # A format-2 record's decision holds its salted body commitment, never a plain hash.
    judged = record.body_commitment if record.format == 2 else record.content_hash
    mine = (decision.record_id, decision.content_hash, decision.agent_id, decision.fleet_id)
    if mine != (record.id, judged, record.agent_id, record.fleet_id):
        return GateProblem(record.id, did, f"record {record.id} names gate decision {did}, "
                           f"which was made for another write (record {decision.record_id} "
                           f"by {decision.agent_id})")
    return None


def _chunks(records: Iterable[spb.Record], size: int) -> Iterator[list[spb.Record]]:
    it = iter(records)
    while chunk := list(islice(it, size)):
        yield chunk


def audit_records(records: Iterable[spb.Record], governance: GovernanceClient) -> GateAudit:
    """Reconcile ``records`` (one fleet's) against governance, a batch of lookups at a time."""
    checked = 0
    problems: list[GateProblem] = []
    for chunk in _chunks(records, LOOKUP_BATCH):
        checked += len(chunk)
        ids = sorted({r.gate_decision_id for r in chunk if r.gate_decision_id})
        found: Mapping[str, gpb.GateDecision] = (
            {d.decision_id: d for d in governance.decisions_by_id(ids)} if ids else {})
        for record in chunk:
            problem = reconcile(record, found.get(record.gate_decision_id))
            if problem is not None:
                problems.append(problem)
    return GateAudit(checked, problems)
