"""CompactorServicer called directly: a real IterationLog on SQLite, a fake shard port."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import grpc
import pytest

from engram.compactor.v1 import compactor_service_pb2 as pb
from services.common.auth import bind_principal, unbind_principal
from services.common.errors import NotFound, PermissionDenied
from services.common.tokens import Principal
from services.compactor.domain.memory_policy import CompactedGroup, CompactionOutcome
from services.compactor.service import MemoryPolicyRunner
from services.compactor.servicer import POLICY, SERVICE_NAME, CompactorServicer
from tests.unit.compactor.support import LogFactory

CONTEXT = cast(grpc.ServicerContext, None)


class FakeShard:
    """Answers like the shard's CompactRecords/ApplyRetention and remembers the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float, bool]] = []

    def compact(self, fleet_id: str, importance_below: float, older_than_days: float,
                dry_run: bool) -> CompactionOutcome:
        self.calls.append(("compact", fleet_id, importance_below, dry_run))
        group = CompactedGroup("sum-1", ("r1", "r2"), ("h1", "h2"), "general", "run-a")
        return CompactionOutcome(examined=5, compacted=2, groups=(group,))

    def apply_retention(self, fleet_id: str, older_than_days: float,
                        dry_run: bool) -> Sequence[str]:
        self.calls.append(("retention", fleet_id, older_than_days, dry_run))
        return ["r1", "r2"]


def test_every_method_has_a_policy_entry() -> None:
    methods = pb.DESCRIPTOR.services_by_name["CompactorService"].methods
    assert SERVICE_NAME == "engram.compactor.v1.CompactorService"
    assert {f"/{SERVICE_NAME}/{m.name}" for m in methods} == set(POLICY)
    assert all(POLICY.values()), "no compactor RPC is public"


@pytest.fixture
def shard() -> FakeShard:
    return FakeShard()


@pytest.fixture
def servicer(make_log: LogFactory, shard: FakeShard) -> CompactorServicer:
    log = make_log(hot_size=2, snapshot_every=3)
    return CompactorServicer(log, MemoryPolicyRunner(shard, log.repo))


def _as(principal: Principal) -> Iterator[None]:
    token = bind_principal(principal)
    try:
        yield
    finally:
        unbind_principal(token)


@pytest.fixture
def agent() -> Iterator[None]:
    yield from _as(Principal("agent-1", "fleet-a", frozenset({"agent"})))


def _record(servicer: CompactorServicer, n: int, detail: str = '{"n": %d}') -> (
        pb.RecordIterationResponse):
    item = pb.IterationInput(iteration=n, plan_digest=f"p{n}", status="success",
                             files_touched=n, detail_json=detail % n, guardrails_json="[]")
    item.start_time.FromJsonString("2025-08-14T12:00:00Z")
    return servicer.RecordIteration(pb.RecordIterationRequest(run_id="run-a", iteration=item),
                                    CONTEXT)


def test_record_retry_reconstruct_and_fleet_scope(servicer: CompactorServicer,
                                                  agent: None) -> None:
    first = [_record(servicer, n) for n in range(1, 6)]
    assert [r.created for r in first] == [True] * 5
    assert [r.summary.iteration for r in first] == [1, 2, 3, 4, 5]
    assert first[1].summary.prev_hash == first[0].summary.hash
    assert first[0].summary.start_time.ToJsonString() == "2025-08-14T12:00:00Z"
    again = _record(servicer, 2)
    assert not again.created and again.summary == first[1].summary
    view = servicer.ReconstructIteration(
        pb.ReconstructIterationRequest(run_id="run-a", iteration=3), CONTEXT)
    assert view.source == pb.DETAIL_SOURCE_COLD_SNAPSHOT and view.detail_json == '{"n":3}'
    view = servicer.ReconstructIteration(
        pb.ReconstructIterationRequest(run_id="run-a", iteration=5), CONTEXT)
    assert view.source == pb.DETAIL_SOURCE_HOT
    assert servicer.VerifyRun(pb.VerifyRunRequest(run_id="run-a"), CONTEXT).ok
    other = bind_principal(Principal("agent-2", "fleet-b", frozenset({"agent"})))
    try:
        with pytest.raises(NotFound):
            servicer.VerifyRun(pb.VerifyRunRequest(run_id="run-a"), CONTEXT)
    finally:
        unbind_principal(other)


def test_memory_policy_fleet_rules_and_recorded_runs(servicer: CompactorServicer,
                                                     shard: FakeShard) -> None:
    token = bind_principal(Principal("agent-1", "fleet-a", frozenset({"admin"})))
    try:
        with pytest.raises(PermissionDenied):
            servicer.CompactMemory(pb.CompactMemoryRequest(fleet_id="fleet-b"), CONTEXT)
        done = servicer.CompactMemory(pb.CompactMemoryRequest(dry_run=True), CONTEXT).run
    finally:
        unbind_principal(token)
    assert shard.calls == [("compact", "fleet-a", 0.3, True)]
    assert (done.fleet_id, done.examined, done.compacted, done.dry_run) == ("fleet-a", 5, 2, True)
    assert list(done.groups[0].replaced_hashes) == ["h1", "h2"]
    token = bind_principal(Principal("svc-compactor", "system", frozenset({"service"})))
    try:  # no service principal runs a fleet's memory policy here (finding 6)
        with pytest.raises(PermissionDenied):
            servicer.ApplyMemoryRetention(
                pb.ApplyMemoryRetentionRequest(fleet_id="fleet-a", older_than_days=60), CONTEXT)
    finally:
        unbind_principal(token)
    token = bind_principal(Principal("agent-1", "fleet-a", frozenset({"admin"})))
    try:
        removed = servicer.ApplyMemoryRetention(
            pb.ApplyMemoryRetentionRequest(fleet_id="fleet-a", older_than_days=60), CONTEXT).run
        listed = servicer.ListPolicyRuns(pb.ListPolicyRunsRequest(fleet_id="fleet-a"), CONTEXT)
    finally:
        unbind_principal(token)
    assert list(removed.removed_ids) == ["r1", "r2"]
    assert [r.id for r in listed.runs] == [removed.id, done.id]
