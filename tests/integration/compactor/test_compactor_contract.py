"""The compactor over real gRPC: iteration logs, errors as statuses, fleets, memory policies."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.shard import ShardClient
from engram.compactor.v1 import compactor_service_pb2 as pb
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings
from tests.conftest import TokenFactory
from tests.integration.compactor.conftest import CompactorFactory

RUN = "run-int"


def iteration(n: int, status: str = "success") -> pb.IterationInput:
    return iteration_from_json({
        "iter": n, "planDigest": f"plan-{n}", "parentDigest": f"plan-{n - 1}",
        "startTs": f"2025-08-14T12:00:{n % 60:02d}Z", "endTs": f"2025-08-14T12:01:{n % 60:02d}Z",
        "filesTouched": n % 4, "netAdd": 10 * n, "netDel": n, "riskScore": 0.25,
        "status": status, "detail": {"context": f"step {n} " * 20, "n": n},
        "guardrails": [{"stage": "tests", "ok": True}],
    })


def test_record_recent_summaries_reconstruct_pin_verify(compactor_for: CompactorFactory,
                                                        tmp_path: Path) -> None:
    client = compactor_for()
    summaries = [client.record(RUN, iteration(n)).summary for n in range(1, 31)]
    assert summaries[0].start_time.ToJsonString() == "2025-08-14T12:00:01Z"
    assert [h.summary.iteration for h in client.recent(RUN, page_size=3)] == [30, 29, 28, 27]
    listed = list(client.summaries(RUN, page_size=7))
    assert listed == summaries
    assert [s.iteration for s in client.summaries(RUN, start_iteration=25)] == list(range(25, 31))
    assert client.record(RUN, iteration(30)).created is False

    view = client.reconstruct(RUN, 30)
    assert view.source == pb.DETAIL_SOURCE_HOT and json.loads(view.detail_json)["n"] == 30
    cold = client.reconstruct(RUN, 25)
    assert cold.source == pb.DETAIL_SOURCE_COLD_SNAPSHOT and json.loads(cold.detail_json)["n"] == 25
    based = client.reconstruct(RUN, 23)
    assert based.source == pb.DETAIL_SOURCE_BASE_SNAPSHOT and based.base_iteration == 20
    assert [s.iteration for s in based.trail] == [21, 22, 23]
    assert client.reconstruct(RUN, 3).source == pb.DETAIL_SOURCE_SUMMARY_ONLY

    assert client.pin(RUN, 12, "too late: 5..15 were retired").snapshot_iteration == 0
    pin = client.pin(RUN, 22, "risk spike at 22")
    assert pin.snapshot_iteration == 20 and pin.reason == "risk spike at 22"
    for n in range(31, 46):
        client.record(RUN, iteration(n))
    assert client.reconstruct(RUN, 22).base_iteration == 20
    report = client.verify(RUN)
    assert report.ok and report.last_iteration == 45 and report.segments_checked >= 2
    assert report.lines_checked == 45 and report.snapshots_checked == 4  # 20 (pinned) + last 3


def test_a_retried_next_record_with_a_request_id_is_recorded_once(
        compactor_for: CompactorFactory) -> None:
    client = compactor_for()
    client.record(RUN, iteration(1))
    first = client.record(RUN, iteration(0), request_id="step-2")
    retry = client.record(RUN, iteration(0), request_id="step-2")
    assert first.created and first.summary.iteration == 2
    assert not retry.created and retry.summary == first.summary
    with pytest.raises(EngramRpcError) as reused:
        client.record(RUN, iteration(0, "failed"), request_id="step-2")
    assert (reused.value.code, reused.value.reason) == (grpc.StatusCode.ALREADY_EXISTS,
                                                        "REQUEST_ID_REUSED")
    assert [s.iteration for s in client.summaries(RUN)] == [1, 2]


def test_errors_arrive_as_statuses_with_reasons(compactor_for: CompactorFactory) -> None:
    client = compactor_for()
    client.record(RUN, iteration(1))
    cases: list[tuple[Callable[[], object], grpc.StatusCode, str]] = [
        (lambda: client.record(RUN, iteration(3)), grpc.StatusCode.FAILED_PRECONDITION,
         "ITERATION_OUT_OF_ORDER"),
        (lambda: client.record(RUN, iteration(1, "failed")), grpc.StatusCode.ALREADY_EXISTS,
         "ITERATION_EXISTS"),
        (lambda: client.reconstruct("missing-run", 1), grpc.StatusCode.NOT_FOUND,
         "RUN_NOT_FOUND"),
        (lambda: client.reconstruct(RUN, 9), grpc.StatusCode.NOT_FOUND, "ITERATION_NOT_FOUND"),
        (lambda: client.record("bad run!", iteration(1)), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_IDENTIFIER"),
        (lambda: client.compact_memory(), grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED"),
    ]
    for call, code, reason in cases:
        with pytest.raises(EngramRpcError) as caught:
            call()
        assert (caught.value.code, caught.value.reason) == (code, reason)


def test_runs_are_scoped_by_the_callers_fleet(compactor_for: CompactorFactory) -> None:
    compactor_for(fleet="fleet-a").record(RUN, iteration(1))
    other = compactor_for(agent="agent-b", fleet="fleet-b")
    with pytest.raises(EngramRpcError) as caught:
        other.reconstruct(RUN, 1)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    other.record(RUN, iteration(1, "failed"))  # same run id, another fleet: its own log
    assert other.verify(RUN).ok


def test_memory_compaction_and_retention_through_the_real_shard(
        compactor_for: CompactorFactory, shard_for: Callable[..., ShardClient]) -> None:
    shard = shard_for()
    low = [shard.add(f"minor note {i} about the build cache", importance=0.1,
                     domain="technical").record for i in range(4)]
    keep = shard.add("critical decision: ship on Friday", importance=0.9,
                     domain="strategy").record
    admin = compactor_for(agent="ops", roles=("admin",))

    dry = admin.compact_memory(dry_run=True, older_than_days=0)
    assert dry.outcome == "succeeded" and dry.dry_run and dry.examined >= 5
    assert dry.compacted == 4 and all(not g.summary_id for g in dry.groups)
    assert sorted(i for g in dry.groups for i in g.replaced_ids) == sorted(r.id for r in low)

    run = admin.compact_memory(older_than_days=0)
    assert run.compacted == 4 and run.trigger == "ops" and run.fleet_id == "fleet-a"
    group = run.groups[0]
    summary = shard.get(group.summary_id)
    assert sorted(group.replaced_hashes) == sorted(r.record_hash for r in low)
    assert summary.fleet_id == "fleet-a"
    assert keep.id not in {i for g in run.groups for i in g.replaced_ids}
    for record in low:  # originals stay stored and verifiable until retention
        assert shard.get(record.id).id == record.id

    retention = admin.apply_retention(older_than_days=1e-9)
    assert retention.kind == pb.POLICY_KIND_RETENTION
    assert sorted(retention.removed_ids) == sorted(r.id for r in low)
    with pytest.raises(EngramRpcError) as caught:
        shard.get(low[0].id)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert shard.get(group.summary_id).id == group.summary_id

    history = list(admin.policy_runs(page_size=2))
    assert [r.id for r in history] == [retention.id, run.id, dry.id]


def test_a_shard_outage_is_unavailable_and_recorded(
        compactor_for: CompactorFactory, shard_server: EngramServer) -> None:
    admin = compactor_for(agent="ops", roles=("admin",))
    shard_server.stop(0)
    with pytest.raises(EngramRpcError) as caught:
        admin.compact_memory(older_than_days=0)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    failed = next(iter(admin.policy_runs()))
    assert failed.outcome == "failed" and "UNAVAILABLE" in failed.error


def test_no_caller_runs_another_fleets_memory_policy(compactor_for: CompactorFactory) -> None:
    admin = compactor_for(agent="ops", roles=("admin",))
    with pytest.raises(EngramRpcError) as caught:
        admin.compact_memory("fleet-b", dry_run=True)
    assert caught.value.reason == "FLEET_MISMATCH"
    for name in ("svc-x", "svc-artifacts", "svc-compactor"):  # finding 6: no service either
        service = compactor_for(agent=name, fleet="system", roles=("service",))
        with pytest.raises(EngramRpcError) as caught:
            service.compact_memory("fleet-b", dry_run=True, older_than_days=0)
        assert caught.value.reason == "ROLE_REQUIRED"


def test_a_shard_refusal_keeps_its_code_and_reason(
        compactor_settings: CompactorSettings, make_token: TokenFactory) -> None:
    assert compactor_settings.service_token_file is not None
    # a token the shard accepts but whose role may not compact
    write_token_file(compactor_settings.service_token_file,
                     make_token("svc-compactor", "system", ("agent",)))
    server = build_compactor_server(compactor_settings).start()
    try:
        admin = CompactorClient(server.address, make_token("ops", "fleet-a", ("admin",)))
        with admin, pytest.raises(EngramRpcError) as caught:
            admin.compact_memory(older_than_days=0)
    finally:
        server.stop(0)
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.PERMISSION_DENIED,
                                                        "ROLE_REQUIRED")
    assert "shard service at" in caught.value.message


def test_pages_end_without_a_trailing_empty_page(compactor_for: CompactorFactory) -> None:
    client = compactor_for()
    for n in range(1, 5):
        client.record(RUN, iteration(n))
    first = client.call(client.stub.ListSummaries,
                        pb.ListSummariesRequest(run_id=RUN, page_size=2))
    second = client.call(client.stub.ListSummaries, pb.ListSummariesRequest(
        run_id=RUN, page_size=2, page_token=first.next_page_token))
    assert [s.iteration for s in [*first.summaries, *second.summaries]] == [1, 2, 3, 4]
    assert first.next_page_token and not second.next_page_token
    hot = client.call(client.stub.ListRecentIterations,
                      pb.ListRecentIterationsRequest(run_id=RUN, page_size=4))
    assert len(hot.iterations) == 4 and not hot.next_page_token


def test_details_are_held_to_the_json_limit_as_stored_and_pages_to_a_byte_budget(
        compactor_for: CompactorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: the 4 MiB limit was checked on the detail as sent, and its canonical
    form was stored: ``1e15`` becomes ``1000000000000000.0``, so a 3.77 MiB detail was kept as
    15 MB, and five such iterations made every ListRecentIterations of the run fail past the
    64 MiB message limit. A page also stops at a byte budget now."""
    client = compactor_for()
    client.record(RUN, iteration(1))
    swollen = iteration(2)
    swollen.detail_json = "[" + ",".join(["1e15"] * 790_000) + "]"  # 3.77 MiB as sent
    with pytest.raises(EngramRpcError) as refused:
        client.record(RUN, swollen)
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                          "LIMIT_EXCEEDED")
    assert "canonical form" in refused.value.message
    monkeypatch.setattr("services.compactor.servicer.RECENT_PAGE_BYTES", 150_000)
    for n in range(2, 6):
        bulky = iteration(n)
        bulky.detail_json = json.dumps({"notes": "x" * 60_000, "n": n})
        client.record(RUN, bulky)
    page = client.call(client.stub.ListRecentIterations,
                       pb.ListRecentIterationsRequest(run_id=RUN))
    assert [h.summary.iteration for h in page.iterations] == [5, 4] and page.next_page_token
    assert [h.summary.iteration for h in client.recent(RUN)][:4] == [5, 4, 3, 2]  # all pages



@pytest.mark.parametrize("days", [float("inf"), float("nan"), 1e12, -1.0])
def test_a_policy_age_no_store_can_hold_is_invalid_argument(
        compactor_for: CompactorFactory, days: float) -> None:
    """Infinity, NaN and 1e12 days reached the cut-off arithmetic and failed INTERNAL (found
    by review on 2026-11-30)."""
    admin = compactor_for(agent="ops", roles=("admin",))
    for call in (lambda: admin.compact_memory(older_than_days=days),
                 lambda: admin.apply_retention(older_than_days=days)):
        with pytest.raises(EngramRpcError) as caught:
            call()
        assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                            "INVALID_POLICY")
