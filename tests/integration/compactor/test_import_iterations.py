"""ImportIterations between two real compactors (SQLite or Postgres at the origin): a run's
iteration log moves with its hashes, the hot ring's and the cold snapshots' details, and
reconstructs and verifies the same on the target; importing twice changes nothing; admin of
the run's own fleet only; altered, out-of-order or unbounded input refused, nothing recorded."""

from __future__ import annotations

from types import SimpleNamespace

import grpc

from engram.bundle.export import Exporter
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.compactor.v1 import compactor_service_pb2 as pb
from services.common.server import EngramServer
from services.compactor.domain.warm_chain import IterationInput, WarmLine, genesis_hash
from services.compactor.servicer import summary_line, summary_pb
from tests.conftest import TokenFactory
from tests.integration.compactor.conftest import CompactorFactory, refused

RUN = "run-9"


def recorded(origin: CompactorClient, count: int = 12) -> list[pb.ImportedIteration]:
    """``count`` iterations at the origin (hot ring 4, a snapshot every 5), then the log as an
    export carries it: every summary, with the details the origin still keeps."""
    for n in range(1, count + 1):
        origin.record(RUN, iteration_from_json({
            "iter": n, "planDigest": f"plan-{n}", "status": "ok", "riskScore": n / 10,
            "startTs": "2026-11-25T10:00:00Z", "detail": {"step": n, "notes": ["a"] * n},
            "guardrails": {"lint": n % 2 == 0}}))
    exporter = Exporter(SimpleNamespace(compactor=origin))  # type: ignore[arg-type]
    details = exporter._iteration_details(RUN, count)
    if count == 12:
        assert sorted(details) == [5, 9, 10, 11, 12]  # the cold snapshots and the hot ring
    return [pb.ImportedIteration(summary=s, detail_json=details.get(s.iteration, ("", ""))[0],
                                 guardrails_json=details.get(s.iteration, ("", ""))[1])
            for s in origin.summaries(RUN)]


def admin(server: EngramServer, make_token: TokenFactory, fleet: str = "fleet-a") -> \
        CompactorClient:
    return CompactorClient(server.address, make_token("op", fleet, ("admin",)))


def test_a_log_moves_with_its_hashes_and_details_and_reconstructs_the_same(
        compactor_for: CompactorFactory, target: EngramServer,
        make_token: TokenFactory) -> None:
    origin = compactor_for()
    log = recorded(origin)
    with admin(target, make_token) as client:
        first = client.import_iterations(RUN, log)
        again = client.import_iterations(RUN, log)
        assert (first.created, first.already_present) == (12, 0)
        assert (again.created, again.already_present) == (0, 12)
        assert list(client.summaries(RUN)) == list(origin.summaries(RUN))
        report = client.verify(RUN)
        assert report.ok and report.last_iteration == 12, report
        for n, source in ((12, pb.DETAIL_SOURCE_HOT), (5, pb.DETAIL_SOURCE_COLD_SNAPSHOT),
                          (7, pb.DETAIL_SOURCE_BASE_SNAPSHOT),
                          (3, pb.DETAIL_SOURCE_SUMMARY_ONLY)):
            here, there = client.reconstruct(RUN, n), origin.reconstruct(RUN, n)
            assert here.source == there.source == source, n
            assert here == there, n
        assert [h.summary.iteration for h in client.recent(RUN)] == [12, 11, 10, 9]


def test_only_an_admin_of_the_fleet_imports_and_lines_do_not_move_between_fleets(
        compactor_for: CompactorFactory, target: EngramServer,
        make_token: TokenFactory) -> None:
    log = recorded(compactor_for())
    with CompactorClient(target.address, make_token("agent-1", "fleet-a")) as agent:
        assert refused(agent.import_iterations, RUN, log).code == \
            grpc.StatusCode.PERMISSION_DENIED
    with admin(target, make_token, "fleet-b") as other:
        # The first line's prev_hash is fleet-a's genesis for the run: it hashes to nothing
        # fleet-b's log can extend.
        error = refused(other.import_iterations, RUN, log)
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                              "ITERATION_HASH_MISMATCH")
        assert refused(other.verify, RUN).code == grpc.StatusCode.NOT_FOUND  # nothing recorded


def test_altered_out_of_order_and_unbounded_imports_are_refused(
        compactor_for: CompactorFactory, target: EngramServer,
        make_token: TokenFactory) -> None:
    log = recorded(compactor_for())

    def altered(item: pb.ImportedIteration, **summary: object) -> pb.ImportedIteration:
        copy = pb.ImportedIteration()
        copy.CopyFrom(item)
        for name, value in summary.items():
            if name == "detail_json":
                copy.detail_json = str(value)
            else:
                setattr(copy.summary, name, value)
        return copy

    with admin(target, make_token) as client:
        for items, code, reason in (
                ([altered(log[0], status="failed")], grpc.StatusCode.INVALID_ARGUMENT,
                 "ITERATION_HASH_MISMATCH"),
                ([*log[:11], altered(log[11], detail_json='{"step":99}')],
                 grpc.StatusCode.INVALID_ARGUMENT, "DETAIL_DIGEST_MISMATCH"),
                ([altered(log[0], hash="z" * 64)], grpc.StatusCode.INVALID_ARGUMENT,
                 "INVALID_HASH"),
                (log[2:], grpc.StatusCode.FAILED_PRECONDITION, "ITERATION_OUT_OF_ORDER"),
                ([], grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_BATCH"),
                ([log[0]] * 1001, grpc.StatusCode.INVALID_ARGUMENT, "BATCH_TOO_LARGE")):
            error = refused(client.import_iterations, RUN, items)
            assert (error.code, error.reason) == (code, reason), (reason, error.message)
        # Each refused before anything was recorded.
        assert refused(client.verify, RUN).code == grpc.StatusCode.NOT_FOUND


def test_another_line_under_an_imported_iteration_is_a_conflict(
        compactor_for: CompactorFactory, target: EngramServer,
        make_token: TokenFactory) -> None:
    log = recorded(compactor_for(), count=2)
    with admin(target, make_token) as client:
        client.import_iterations(RUN, log)
        first = summary_line(log[0].summary)
        forged = WarmLine.chained(
            IterationInput(iteration=1, plan_digest="forged", parent_digest="",
                           start_ts=first.start_ts, end_ts="", files_touched=0, net_add=0,
                           net_del=0, risk_score=0.0, status="ok", detail_json="null",
                           guardrails_json="null"),
            1, genesis_hash("fleet-a", RUN), first.detail_digest)
        error = refused(client.import_iterations, RUN,
                        [pb.ImportedIteration(summary=summary_pb(forged))])
        assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS,
                                              "ITERATION_EXISTS")
        assert list(client.summaries(RUN)) == [item.summary for item in log]


def test_summaries_without_details_go_to_the_warm_log_only(
        compactor_for: CompactorFactory, target: EngramServer,
        make_token: TokenFactory) -> None:
    """An origin that kept only summaries: nothing in the hot ring or the cold tier stands in
    for the details (a snapshot of no detail would rebuild later iterations wrongly)."""
    log = [pb.ImportedIteration(summary=item.summary) for item in recorded(compactor_for())]
    with admin(target, make_token) as client:
        assert client.import_iterations(RUN, log).created == 12
        assert client.verify(RUN).ok
        assert not list(client.recent(RUN))
        for n in (12, 10, 5, 1):
            view = client.reconstruct(RUN, n)
            assert view.source == pb.DETAIL_SOURCE_SUMMARY_ONLY and not view.detail_json, n


def test_times_out_of_range_are_invalid_not_internal(
        compactor_for: CompactorFactory, target: EngramServer,
        make_token: TokenFactory) -> None:
    log = recorded(compactor_for(), count=1)
    far = pb.ImportedIteration()
    far.CopyFrom(log[0])
    far.summary.start_time.seconds = 2**40
    with admin(target, make_token) as client:
        error = refused(client.import_iterations, RUN, [far])
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                              "INVALID_TIMESTAMP")
        iteration = iteration_from_json({"iter": 1, "status": "ok"})
        iteration.end_time.nanos = -1
        error = refused(client.record, RUN, iteration)
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                              "INVALID_TIMESTAMP")
