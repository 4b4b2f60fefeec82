"""Load that cannot starve others: in-flight and per-agent rate limits on a real server.

Both refusals are RESOURCE_EXHAUSTED with an ErrorInfo reason and a google.rpc.RetryInfo
delay, answered before the method runs; the SDK waits that delay and retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram.client import EngramRpcError, ShardClient
from engram.client.shard import record_input
from engram.shard.v1 import shard_service_pb2 as pb
from services.common.server import EngramServer
from services.common.settings import LimitsSettings
from services.shard.server import build_shard_server
from services.shard.servicer import ShardServicer
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


def _shard(engram_home: Path, tmp_path: Path, **limits: Any) -> EngramServer:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True, embedder="none", **limits)
    server, _service = build_shard_server(settings)
    return server.start()


class HeldStatus:
    """GetStatus calls wait for ``release``; ``entered`` counts the ones waiting."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> HeldStatus:
    hold = HeldStatus()
    status = ShardServicer.GetStatus

    def slow_status(self: ShardServicer, request: Any, context: Any) -> Any:
        hold.entered.release()
        hold.release.wait(30)
        return status(self, request, context)

    monkeypatch.setattr(ShardServicer, "GetStatus", slow_status)  # before the server binds it
    return hold


@pytest.fixture
def small_shard(engram_home: Path, tmp_path: Path, held: HeldStatus) -> Iterator[EngramServer]:
    server = _shard(engram_home, tmp_path, max_concurrent_rpcs=2)
    yield server
    held.release.set()
    server.stop(0)


@pytest.fixture
def throttled_shard(engram_home: Path, tmp_path: Path) -> Iterator[EngramServer]:
    server = _shard(engram_home, tmp_path, rate_limit_writes=2.0, rate_limit_write_burst=3,
                    rate_limit_reads=50.0, rate_limit_read_burst=50)
    yield server
    server.stop(0)


def _refusal(call: Any) -> EngramRpcError:
    with pytest.raises(EngramRpcError) as refused:
        call()
    return refused.value


def test_a_call_past_the_in_flight_limit_is_refused_at_once(
        small_shard: EngramServer, held: HeldStatus, make_token: TokenFactory) -> None:
    entered, release = held.entered, held.release
    busy = [ShardClient(small_shard.address, make_token(f"agent-{i}")) for i in range(2)]
    other = ShardClient(small_shard.address, make_token("agent-9", "fleet-b"))
    other.max_retries = 0
    holders = [threading.Thread(target=client.status) for client in busy]
    for holder in holders:
        holder.start()
    try:
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
        started = time.monotonic()
        refused = _refusal(lambda: other.call(other.stub.ListDomains, pb.ListDomainsRequest(),
                                              timeout=5))
        assert time.monotonic() - started < 1.0, "the refusal must not wait for a slot"
        assert (refused.code, refused.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                  "CONCURRENCY_LIMIT")
        assert refused.retry_delay is not None and refused.retry_delay > 0
        assert "ENGRAM_SHARD_MAX_CONCURRENT_RPCS" in refused.message
        with grpc.insecure_channel(small_shard.address) as channel:  # probes still answered
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                                timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        release.set()
        for holder in holders:
            holder.join(30)
    assert other.call(other.stub.ListDomains, pb.ListDomainsRequest(), timeout=5) is not None
    for client in (*busy, other):
        client.close()


def test_one_agent_over_its_write_rate_is_refused_and_others_are_not(
        throttled_shard: EngramServer, make_token: TokenFactory) -> None:
    noisy = ShardClient(throttled_shard.address, make_token("noisy", "fleet-a"))
    noisy.max_retries = 0
    quiet = ShardClient(throttled_shard.address, make_token("quiet", "fleet-a"))
    with noisy, quiet:
        for i in range(3):  # the burst
            noisy.add(f"noisy memory number {i}")
        refused = _refusal(lambda: noisy.add("one write too many"))
        assert (refused.code, refused.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                  "RATE_LIMITED")
        assert refused.retry_delay is not None and 0 < refused.retry_delay <= 0.5
        assert refused.metadata["kind"] == "write"
        assert "ENGRAM_SHARD_RATE_LIMIT_WRITES" in refused.message
        assert noisy.status() is not None, "reads have their own bucket"
        assert quiet.add("another agent still writes").created


def test_the_sdk_waits_out_retry_info_and_retries(
        throttled_shard: EngramServer, make_token: TokenFactory) -> None:
    with ShardClient(throttled_shard.address, make_token("patient", "fleet-a")) as client:
        # Timed from before the burst, as the bucket refills from the first write's admission:
        # the fourth comes in 0.5 s (2 a second) after it, however slow the first three were
        # (timed from their end, a loaded machine failed 7 runs in 15: three writes that took
        # 0.3 s left less than the 0.3 s asserted to wait).
        started = time.monotonic()
        for i in range(3):
            client.add(f"patient memory number {i}")
        assert client.add("written once the bucket refills").created
        assert time.monotonic() - started >= 0.45


def test_service_principals_are_not_rate_limited_per_agent(
        throttled_shard: EngramServer, make_service_token: Any) -> None:
    with ShardClient(throttled_shard.address, make_service_token("compactor")) as compactor:
        compactor.max_retries = 0
        for _ in range(6):
            compactor.compact("fleet-a", importance_below=0.1, older_than_days=0, dry_run=True)


@pytest.fixture
def adaptive_shard(engram_home: Path, tmp_path: Path, held: HeldStatus) -> Iterator[EngramServer]:
    server = _shard(engram_home, tmp_path, admission="adaptive", max_concurrent_rpcs=2)
    yield server
    held.release.set()
    server.stop(0)


def test_adaptive_admission_refuses_the_caller_past_its_share_before_parsing(
        adaptive_shard: EngramServer, held: HeldStatus, make_token: TokenFactory) -> None:
    """Agent A holds both calls the limit allows: its third is refused OVERLOADED (garbage bytes
    and all: refused before its request is parsed); B, with none in flight, is admitted."""
    token_a = make_token("agent-a")
    busy = ShardClient(adaptive_shard.address, token_a)
    holders = [threading.Thread(target=busy.status) for _ in range(2)]
    for holder in holders:
        holder.start()
    other = ShardClient(adaptive_shard.address, make_token("agent-b"))
    try:
        assert held.entered.acquire(timeout=10) and held.entered.acquire(timeout=10)
        with grpc.insecure_channel(adaptive_shard.address) as channel:
            raw = channel.unary_unary("/engram.shard.v1.ShardService/ListDomains")
            with pytest.raises(grpc.RpcError) as refused:
                raw(b"\xff\xff not a message", metadata=busy.metadata, timeout=5)
        failure = EngramRpcError.from_rpc_error(refused.value)
        assert (failure.code, failure.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                  "OVERLOADED")
        assert failure.retry_delay is not None and failure.retry_delay > 0
        assert failure.metadata["caller_in_flight"] == "2"
        assert "ENGRAM_SHARD_ADMISSION" in failure.message
        # Another token of agent A is agent A: no second share (before 2026-11-29 callers were
        # keyed by token, so an agent minting tokens took a share, or the spare room, each).
        with ShardClient(adaptive_shard.address, make_token("agent-a")) as second:
            second.max_retries = 0
            with pytest.raises(EngramRpcError) as again:
                second.call(second.stub.ListDomains, pb.ListDomainsRequest(), timeout=5)
        assert (again.value.code, again.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                          "OVERLOADED")
        # A forged token is refused as such, before it takes a place.
        with ShardClient(adaptive_shard.address, "not.a.token") as forged, \
                pytest.raises(EngramRpcError) as refused_forged:
            forged.call(forged.stub.ListDomains, pb.ListDomainsRequest(), timeout=5)
        assert refused_forged.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert other.call(other.stub.ListDomains, pb.ListDomainsRequest(), timeout=5) is not None
    finally:
        held.release.set()
        for holder in holders:
            holder.join(30)
    with grpc.insecure_channel(adaptive_shard.address) as channel:  # admitted: parsed, refused
        raw = channel.unary_unary("/engram.shard.v1.ShardService/ListDomains")
        with pytest.raises(grpc.RpcError) as unparsed:
            raw(b"\xff\xff not a message", metadata=busy.metadata, timeout=5)
    assert unparsed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for client in (busy, other):
        client.close()


@pytest.fixture
def endless_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    """SnapshotForRun streams 64 KiB messages until its caller goes: unread, it blocks."""
    def endless(self: ShardServicer, request: Any, context: Any) -> Iterator[Any]:
        record = pb.Record(id="r", content="x" * 65536)
        while True:
            yield pb.SnapshotForRunResponse(record=record)

    monkeypatch.setattr(ShardServicer, "SnapshotForRun", endless)


@pytest.fixture
def four_slot_shard(engram_home: Path, tmp_path: Path,
                    endless_snapshots: None) -> Iterator[EngramServer]:
    server = _shard(engram_home, tmp_path, max_concurrent_rpcs=4)  # fleet cap: half, 2
    yield server
    server.stop(0)


def test_one_fleets_unread_streams_stop_at_its_cap_and_other_fleets_get_in(
        four_slot_shard: EngramServer, make_token: TokenFactory) -> None:
    """Found by review: streams were capped per agent only, so a fleet's admin minting tokens
    for many agent ids held every slot with streams it never read; every other fleet got
    CONCURRENCY_LIMIT. A fleet now holds at most ENGRAM_SHARD_MAX_STREAMS_PER_FLEET
    (default half of MAX_CONCURRENT_RPCS), and a cancelled stream gives its place back."""
    clients = [ShardClient(four_slot_shard.address, make_token(f"minted-{i}", "fleet-a"))
               for i in range(4)]
    other = ShardClient(four_slot_shard.address, make_token("quiet", "fleet-b"))
    for client in (*clients, other):
        client.max_retries = 0

    def open_stream(client: ShardClient) -> Any:
        call = client.stub.SnapshotForRun(pb.SnapshotForRunRequest(run_id="run"),
                                          metadata=client.metadata, timeout=30)
        next(call)  # admitted and streaming; never read again
        return call

    held = [open_stream(clients[0]), open_stream(clients[1])]
    try:
        with pytest.raises(grpc.RpcError) as refused:
            open_stream(clients[2])  # another agent id of the same fleet
        failure = EngramRpcError.from_rpc_error(refused.value)
        assert (failure.code, failure.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                  "STREAM_LIMIT")
        assert failure.metadata["scope"] == "fleet" and failure.metadata["limit"] == "2"
        assert "ENGRAM_SHARD_MAX_STREAMS_PER_FLEET" in failure.message
        assert failure.retry_delay is not None and failure.retry_delay > 0
        held.append(open_stream(other))  # another fleet still opens one
        assert other.call(other.stub.ListDomains, pb.ListDomainsRequest(), timeout=5) is not None
        for call in held[:2]:  # the fleet's streams end: their places come back
            call.cancel()
        deadline = time.monotonic() + 10
        for client in clients[2:]:
            while True:
                try:
                    held.append(open_stream(client))
                    break
                except grpc.RpcError as error:
                    assert EngramRpcError.from_rpc_error(error).reason in (
                        "STREAM_LIMIT", "CONCURRENCY_LIMIT")
                    assert time.monotonic() < deadline, "cancelled streams kept their places"
                    time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as again:
            open_stream(clients[0])
        assert EngramRpcError.from_rpc_error(again.value).reason == "STREAM_LIMIT"
    finally:
        for call in held:
            call.cancel()
        for client in (*clients, other):
            client.close()


def test_streams_ended_by_their_deadline_give_their_places_back(
        four_slot_shard: EngramServer, make_token: TokenFactory) -> None:
    clients = [ShardClient(four_slot_shard.address, make_token(f"minted-{i}", "fleet-a"))
               for i in range(2)]

    def open_stream(client: ShardClient, timeout: float) -> Any:
        call = client.stub.SnapshotForRun(pb.SnapshotForRunRequest(run_id="run"),
                                          metadata=client.metadata, timeout=timeout)
        next(call)
        return call

    expiring = [open_stream(client, 1.0) for client in clients]
    time.sleep(1.0)
    held: list[Any] = []
    deadline = time.monotonic() + 10
    try:
        for client in clients:
            while True:
                try:
                    held.append(open_stream(client, 30))
                    break
                except grpc.RpcError as error:
                    assert EngramRpcError.from_rpc_error(error).reason in (
                        "STREAM_LIMIT", "CONCURRENCY_LIMIT")
                    assert time.monotonic() < deadline, "expired streams kept their places"
                    time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as refused:  # and only theirs: the cap holds
            open_stream(clients[0], 30)
        assert EngramRpcError.from_rpc_error(refused.value).reason == "STREAM_LIMIT"
    finally:
        for call in (*expiring, *held):
            call.cancel()
        for client in clients:
            client.close()


@pytest.fixture
def record_throttled_shard(engram_home: Path, tmp_path: Path) -> Iterator[EngramServer]:
    server = _shard(engram_home, tmp_path, limits=LimitsSettings(batch_items=10),
                    rate_limit_records=5.0, rate_limit_record_burst=10)
    yield server
    server.stop(0)


def test_a_batch_flood_over_the_record_rate_is_refused_whole_and_others_still_write(
        record_throttled_shard: EngramServer, make_token: TokenFactory) -> None:
    """Found by review: the write rate counted calls, so 100 calls a second of 1,000 records
    each passed it. A batch now takes a token a record (ENGRAM_SHARD_RATE_LIMIT_RECORDS),
    admitted whole or refused before anything of it is stored."""
    noisy = ShardClient(record_throttled_shard.address, make_token("noisy", "fleet-a"))
    noisy.max_retries = 0
    quiet = ShardClient(record_throttled_shard.address, make_token("quiet", "fleet-a"))
    quiet.max_retries = 0
    with noisy, quiet:
        created = noisy.add_many([record_input(f"first batch record {i}") for i in range(10)])
        assert all(result.created for result in created.results)  # a full batch fits
        refusals = []
        for flood in range(4):  # two write calls of the write bucket's 200: not what refuses
            batch = [record_input(f"flood {flood} record {i}") for i in range(10)]
            refusals.append(_refusal(lambda batch=batch: noisy.add_many(batch)))
        for refused in refusals:
            assert (refused.code, refused.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                      "RATE_LIMITED")
            assert refused.metadata["kind"] == "records"
            assert refused.metadata["records"] == "10"
            assert refused.retry_delay is not None and 0 < refused.retry_delay <= 2.0
            assert "ENGRAM_SHARD_RATE_LIMIT_RECORDS" in refused.message
        assert quiet.add("another agent still writes a record").created
        contents = {record.content for record in quiet.list()}
        assert not [c for c in contents if c.startswith("flood")], "a refused batch stored"
        assert len(contents) == 11


def test_a_client_that_waits_the_retry_delay_gets_its_batch_in(
        record_throttled_shard: EngramServer, make_token: TokenFactory) -> None:
    with ShardClient(record_throttled_shard.address, make_token("patient")) as client:
        # Timed from before the first batch, which empties the bucket (burst 10) when it is
        # admitted: the next 4 records at 5 a second come in 0.8 s after that, however slow
        # the first call was (CI on 653451d timed from its end: a first call that took 0.3 s
        # under load left 0.33 s to wait, not the 0.6 asserted).
        started = time.monotonic()
        client.add_many([record_input(f"patient first {i}") for i in range(10)])
        reply = client.add_many([record_input(f"patient second {i}") for i in range(4)])
        assert all(result.created for result in reply.results)
        assert time.monotonic() - started >= 0.75  # the rate bounds it below, load only adds


def test_an_admins_import_is_not_held_to_the_record_rate(
        record_throttled_shard: EngramServer, make_token: TokenFactory) -> None:
    """ImportRecords is the admin's restore of a bundle (engram import-bundle): it goes at
    the store's speed, not at an agent's record rate (1,000 a second by default halved the
    bundle import's measured rate)."""
    with ShardClient(record_throttled_shard.address, make_token("writer")) as writer:
        writer.add_many([record_input(f"kept record {i}") for i in range(10)])
        stored = list(writer.list())
    admin = ShardClient(record_throttled_shard.address, make_token("op", roles=("admin",)))
    admin.max_retries = 0
    with admin:
        for _ in range(4):  # 40 records at once against a bucket of 10 at 5 a second
            assert admin.import_records(stored).already_present == 10
