"""The shared runtime as production runs it: health, reflection, metrics, drain, auth."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from engram.shard.v1 import shard_service_pb2 as pb
from engram.shard.v1 import shard_service_pb2_grpc as pb_grpc
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


@pytest.fixture
def running(tmp_path: Path, engram_home: Path):  # type: ignore[no-untyped-def]
    settings = ShardSettings(
        home=engram_home,
        db_url=f"sqlite:///{tmp_path / 's.db'}",
        port=0,
        metrics_port=0,
        grace_seconds=2,
        allow_ungated=True,
    )
    server, service = build_shard_server(settings)
    server.start()
    yield server, service
    server.stop(0)


def test_health_reflection_and_metrics(running, make_token: TokenFactory) -> None:  # type: ignore[no-untyped-def]
    server, _service = running
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "engram.shard.v1.ShardService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = list(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        )
        names = {s.name for s in answers[0].list_services_response.service}
        assert "engram.shard.v1.ShardService" in names
        stub = pb_grpc.ShardServiceStub(channel)
        token = make_token()
        stub.GetStatus(pb.GetStatusRequest(), metadata=[("authorization", f"Bearer {token}")])
        with pytest.raises(grpc.RpcError):
            stub.GetStatus(pb.GetStatusRequest())
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
    assert (
        'grpc_server_handled_total{grpc_code="OK",grpc_method="GetStatus",'
        'grpc_service="engram.shard.v1.ShardService",grpc_type="unary"} 1.0'
    ) in body
    assert 'grpc_code="UNAUTHENTICATED",grpc_method="GetStatus"' in body
    assert "grpc_server_started_total" in body and "grpc_server_handling_seconds_bucket" in body


def test_errors_carry_error_info_and_no_stack_trace(running, make_token: TokenFactory) -> None:  # type: ignore[no-untyped-def]
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    server, _service = running
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.ShardServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.CreateRecord(
                pb.CreateRecordRequest(record=pb.RecordInput(content="")),
                metadata=[("authorization", f"Bearer {make_token()}")],
            )
    status = rpc_status.from_call(caught.value)
    assert status is not None and status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.reason == "EMPTY_CONTENT" and info.domain == "engram.dev"
    assert "Traceback" not in caught.value.details()


def test_graceful_stop_flips_health_then_drains(running, make_token: TokenFactory) -> None:  # type: ignore[no-untyped-def]
    server, service = running
    started, release = threading.Event(), threading.Event()
    original = service.status

    def slow_status(principal):  # type: ignore[no-untyped-def]
        started.set()
        release.wait(5)
        return original(principal)

    service.status = slow_status  # type: ignore[method-assign]
    outcome: dict[str, object] = {}
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.ShardServiceStub(channel)

    def call() -> None:
        try:
            outcome["reply"] = stub.GetStatus(
                pb.GetStatusRequest(), metadata=[("authorization", f"Bearer {make_token()}")]
            )
        except grpc.RpcError as error:
            outcome["error"] = error

    caller = threading.Thread(target=call)
    caller.start()
    assert started.wait(5)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    deadline = time.monotonic() + 5
    health = health_pb2_grpc.HealthStub(channel)
    status = None
    while time.monotonic() < deadline:
        try:
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
        except grpc.RpcError:
            break
        if status == health_pb2.HealthCheckResponse.NOT_SERVING:
            break
        time.sleep(0.02)
    release.set()
    caller.join(5)
    stopper.join(10)
    channel.close()
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert "reply" in outcome, outcome.get("error")  # the in-flight call finished


def test_a_check_failing_during_the_warm_up_is_not_overwritten_by_serving(
        engram_home: Path) -> None:
    """A check that fails while the warm-up still runs (governance's background chain
    verification finishing first) leaves health NOT_SERVING: the warm-up's end does not set
    SERVING over it. Found by CI: a truncated chain's start read SERVING after the verification
    had said NOT_SERVING."""
    from services.common.server import ServiceSpec, build_server
    from services.common.settings import ServerSettings

    warming, release = threading.Event(), threading.Event()
    intact = {"chain": True}

    def warm_up(stopping: threading.Event) -> None:
        warming.set()
        release.wait(10)

    spec = ServiceSpec(name="checked", full_names=["engram.test.v1.Checked"],
                       register=lambda _server: None, policy={}, kinds={},
                       warm_up=warm_up, ready=lambda: intact["chain"])
    server = build_server(ServerSettings(home=engram_home, port=0), spec)
    starting = threading.Thread(target=server.start)
    starting.start()
    try:
        assert warming.wait(10)
        intact["chain"] = False  # what the background check does when it finds a break
        server.set_serving(False)
        release.set()
        starting.join(10)
        time.sleep(0.2)  # the warm-up thread's end, had it set SERVING
        with grpc.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "engram.test.v1.Checked"):
                status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING, name
    finally:
        release.set()
        server.stop(0)


def test_liveness_stays_serving_while_readiness_follows_the_database(
        engram_home: Path) -> None:
    """Kubernetes probes liveness on LIVENESS and readiness on "": with the database gone the
    service is not ready (no traffic) but alive (no restart). A liveness probe on "" killed
    every replica in a database failover, which then could not start while it lasted."""
    from services.common.server import LIVENESS, ServiceSpec, build_server
    from services.common.settings import ServerSettings

    database_up = threading.Event()
    database_up.set()
    spec = ServiceSpec(name="probed", full_names=["engram.test.v1.Probed"],
                       register=lambda _server: None, policy={}, kinds={},
                       probe=database_up.is_set)
    server = build_server(ServerSettings(home=engram_home, port=0), spec)
    server.start()

    def statuses() -> tuple[int, int]:
        with grpc.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            return tuple(health.Check(health_pb2.HealthCheckRequest(service=name)).status
                         for name in ("", LIVENESS))  # type: ignore[return-value]

    def until(wanted: tuple[int, int]) -> None:
        deadline = time.monotonic() + 10
        while statuses() != wanted:
            assert time.monotonic() < deadline, statuses()
            time.sleep(0.05)

    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        until((serving, serving))
        database_up.clear()  # the database goes away
        until((not_serving, serving))
        database_up.set()
        until((serving, serving))
    finally:
        server.stop(0)


def test_stop_ends_the_servers_worker_threads(tmp_path: Path, engram_home: Path,
                                              make_token: TokenFactory) -> None:
    """gRPC never shuts a server's thread pool down: before stop() did, every worker thread a
    server had started (one per call it ran at once) stayed alive, idle, after the server was
    gone (found in a test run: 40 `shard-rpc_N` threads left in the worker)."""
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 's.db'}",
                             port=0, health_port=0, allow_ungated=True)
    earlier = set(_pool_threads())  # left by servers of other tests in this process
    server, _ = build_shard_server(settings)
    server.start()
    try:
        token = make_token("agent-a", "fleet-a")
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.ShardServiceStub(channel)
            calls = [stub.ListDomains.future(pb.ListDomainsRequest(),
                                             metadata=[("authorization", f"Bearer {token}")])
                     for _ in range(8)]
            for call in calls:
                call.result(timeout=10)
        with grpc.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                      timeout=10)
        assert set(_pool_threads()) - earlier, "the calls ran on no new pool thread"
    finally:
        server.stop(0)
    deadline = time.monotonic() + 5
    while set(_pool_threads()) - earlier and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(t.name for t in set(_pool_threads()) - earlier) == []


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.is_alive() and t.name.startswith(("shard-rpc", "health_"))]
