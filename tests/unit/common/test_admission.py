"""Token buckets, the rate limiter and the in-flight limit, on a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from services.common.admission import (
    READ,
    WRITE,
    ConcurrencyLimit,
    RateLimiter,
    RecordRate,
    StreamsPerAgent,
)
from services.common.auth import (
    bind_principal,
    caller_kinds,
    service_principal,
    unbind_principal,
)
from services.common.errors import ResourceExhausted
from services.common.interceptors import StreamLimitInterceptor
from services.common.tokens import Principal


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_refills_at_its_rate_and_says_when() -> None:
    clock = Clock()
    limiter = RateLimiter({READ: (0.0, 1), WRITE: (2.0, 2)},
                          {READ: "READS", WRITE: "WRITES"}, clock)
    limiter.admit("f", "a", WRITE)
    limiter.admit("f", "a", WRITE)
    with pytest.raises(ResourceExhausted) as refused:
        limiter.admit("f", "a", WRITE)
    assert refused.value.reason == "RATE_LIMITED"
    assert refused.value.retry_delay == pytest.approx(0.5)
    limiter.admit("f", "b", WRITE)  # another agent has its own bucket
    limiter.admit("g", "a", WRITE)  # and the same id in another fleet too
    clock.now += 0.5
    limiter.admit("f", "a", WRITE)
    for _ in range(1000):  # a rate of 0 turns the kind off
        limiter.admit("f", "a", READ)


def test_full_buckets_are_forgotten_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(RateLimiter, "MAX_BUCKETS", 3)
    limiter = RateLimiter({WRITE: (1.0, 1)}, {WRITE: "WRITES"}, clock)
    for agent in ("a", "b", "c"):
        limiter.admit("f", agent, WRITE)
    clock.now += 5  # all three refilled: dropping them changes nothing
    limiter.admit("f", "d", WRITE)
    assert len(limiter._buckets) == 1
    limiter.admit("f", "a", WRITE)


def test_the_in_flight_limit_refuses_one_more_and_frees_on_leave() -> None:
    limit = ConcurrencyLimit(2, "ENGRAM_X_MAX_CONCURRENT_RPCS")
    limit.enter()
    limit.enter()
    with pytest.raises(ResourceExhausted) as refused:
        limit.enter()
    assert refused.value.reason == "CONCURRENCY_LIMIT"
    assert refused.value.retry_delay is not None
    limit.leave()
    limit.enter()
    assert limit.in_flight == 2


def test_a_service_identity_comes_from_the_service_role_and_its_agent_id() -> None:
    assert caller_kinds(Principal(*service_principal("shard"))) == {"service", "service:shard"}
    assert caller_kinds(Principal("svc-shard", "system", frozenset({"agent"}))) == {"agent"}
    assert caller_kinds(Principal("svc-nope", "system", frozenset({"service"}))) == {"service"}
    assert caller_kinds(Principal("shard", "system", frozenset({"service"}))) == {"service"}
    with pytest.raises(ValueError):
        service_principal("nope")


def test_an_agent_holds_at_most_its_streams_and_others_are_not_affected() -> None:
    # A caller that opened ~140 snapshot streams and never read them held every slot of
    # max_concurrent_rpcs: every other fleet's calls were refused until its sockets closed.
    def forever(_request: object, _context: object) -> Iterator[int]:
        while True:
            yield 1

    method = "/engram.shard.v1.ShardService/SnapshotForRun"
    wrapped = StreamLimitInterceptor(StreamsPerAgent(2, "ENGRAM_SHARD_MAX_STREAMS_PER_AGENT"),
                                     {method: READ}).wrap(forever, method, True)

    def opened(agent: str, roles: frozenset[str] = frozenset({"agent"}),
               fleet: str = "fleet-a") -> Iterator[int]:
        token = bind_principal(Principal(agent_id=agent, fleet_id=fleet, roles=roles))
        try:
            stream = wrapped(None, None)
            next(stream)  # the stream is open (the limit is taken when it starts)
            return stream
        finally:
            unbind_principal(token)

    first, second = opened("greedy"), opened("greedy")
    with pytest.raises(ResourceExhausted) as refused:
        opened("greedy")
    assert refused.value.reason == "STREAM_LIMIT"
    other = opened("polite")  # another agent is not refused
    services = [opened("svc", frozenset({"service"}), "system")
                for _ in range(5)]  # not limited
    # role service minted for another fleet is no service: limited as an agent is
    opened("svc-a", frozenset({"service"})).close()
    posing = opened("svc-a", frozenset({"service"}))
    posing_too = opened("svc-a", frozenset({"service"}))
    with pytest.raises(ResourceExhausted):
        opened("svc-a", frozenset({"service"}))
    posing.close()
    posing_too.close()
    first.close()  # a stream that ends gives its place back
    again = opened("greedy")
    for stream in (second, other, again, *services):
        stream.close()


SNAPSHOT = "/engram.shard.v1.ShardService/SnapshotForRun"


def _stream_opener(streams: StreamsPerAgent) -> Callable[[str, str], Iterator[int]]:
    """Opens an endless server stream of SnapshotForRun as the agent of a fleet, through the
    stream limit (taken when the stream starts)."""
    def forever(_request: object, _context: object) -> Iterator[int]:
        while True:
            yield 1

    wrapped = StreamLimitInterceptor(streams, {SNAPSHOT: READ}).wrap(forever, SNAPSHOT, True)

    def opened(agent: str, fleet: str) -> Iterator[int]:
        token = bind_principal(Principal(agent_id=agent, fleet_id=fleet,
                                         roles=frozenset({"agent"})))
        try:
            stream = wrapped(None, None)
            next(stream)
            return stream
        finally:
            unbind_principal(token)

    return opened


def test_a_fleet_holds_at_most_its_streams_whatever_its_agent_ids() -> None:
    # Found by review: the cap was per (fleet, agent) only, so an admin who minted tokens for
    # many agent ids of its fleet held every slot of max_concurrent_rpcs with unread streams.
    streams = StreamsPerAgent(2, "ENGRAM_SHARD_MAX_STREAMS_PER_AGENT",
                              3, "ENGRAM_SHARD_MAX_STREAMS_PER_FLEET")
    opened = _stream_opener(streams)

    held = [opened(f"minted-{i}", "fleet-a") for i in range(3)]  # one agent id each
    with pytest.raises(ResourceExhausted) as refused:
        opened("minted-3", "fleet-a")
    assert refused.value.reason == "STREAM_LIMIT"
    assert refused.value.metadata == {"limit": "3", "scope": "fleet",
                                      "setting": "ENGRAM_SHARD_MAX_STREAMS_PER_FLEET"}
    assert "ENGRAM_SHARD_MAX_STREAMS_PER_FLEET" in refused.value.message
    assert refused.value.retry_delay is not None
    other = opened("minted-0", "fleet-b")  # the same agent id in another fleet: its own count
    assert streams.open_in("fleet-a") == 3
    held[0].close()  # a closed stream gives its place back, once
    held[0].close()
    assert streams.open_in("fleet-a") == 2
    held.append(opened("minted-3", "fleet-a"))
    with pytest.raises(ResourceExhausted):
        opened("minted-4", "fleet-a")
    for stream in (*held, other):
        stream.close()
    assert streams.open_in("fleet-a") == streams.open_in("fleet-b") == 0


def test_two_fleets_at_their_stream_limits_leave_slots_for_calls_and_other_fleets() -> None:
    # Found by review: streams were capped per agent and per fleet (half the concurrency
    # limit) only, so two fleets' unread streams together held every slot of
    # max_concurrent_rpcs and every other fleet's calls were refused.
    from services.common.server import streams_limit
    from services.shard.settings import ShardSettings

    settings = ShardSettings(max_concurrent_rpcs=16)  # 8 a fleet, 12 in all, 3 kept
    streams = streams_limit(settings)
    opened = _stream_opener(streams)

    held: list[Iterator[int]] = []
    scopes = []
    for fleet in ("fleet-a", "fleet-b"):  # each takes all it may, one agent id a stream
        for i in range(settings.max_concurrent_rpcs):
            try:
                held.append(opened(f"minted-{i}", fleet))
            except ResourceExhausted as refused:
                assert refused.reason == "STREAM_LIMIT"
                scopes.append(refused.metadata["scope"])
                break
    assert len(held) < settings.max_concurrent_rpcs  # unary calls still find slots
    # fleet-a stops at its own limit; fleet-b may enter the kept quarter while it holds less
    # than a quarter of it (3), then stops there too, leaving the rest to other fleets
    assert (streams.open_in("fleet-a"), streams.open_in("fleet-b")) == (8, 3)
    assert scopes == ["fleet", "service"]
    newcomer = opened("scout", "fleet-c")
    with pytest.raises(ResourceExhausted) as refused:
        opened("scout", "fleet-d")
    assert refused.value.metadata == {"limit": "12", "scope": "service",
                                      "setting": "ENGRAM_SHARD_MAX_STREAMS"}
    assert "ENGRAM_SHARD_MAX_STREAMS" in refused.value.message
    held.pop().close()  # fleet-b's: a closed stream gives its place back
    opened("scout", "fleet-d").close()
    for stream in (*held, newcomer):
        stream.close()
    assert streams.open_in("fleet-a") == streams.open_in("fleet-c") == 0


def test_a_refused_or_failed_stream_leaves_the_counts_as_they_were() -> None:
    def failing(_request: object, _context: object) -> Iterator[int]:
        yield 1
        raise RuntimeError("the store failed mid-stream")

    method = "/engram.shard.v1.ShardService/SnapshotForRun"
    streams = StreamsPerAgent(1, "PER_AGENT", 1, "PER_FLEET")
    wrapped = StreamLimitInterceptor(streams, {method: READ}).wrap(failing, method, True)
    token = bind_principal(Principal(agent_id="a", fleet_id="f", roles=frozenset({"agent"})))
    try:
        stream = wrapped(None, None)
        next(stream)
        with pytest.raises(ResourceExhausted):  # the agent's cap refuses first, takes nothing
            next(wrapped(None, None))
        assert streams.open_in("f") == 1
        with pytest.raises(RuntimeError):
            next(stream)
        assert streams.open_in("f") == 0
        stream.close()
        assert streams.open_in("f") == 0
    finally:
        unbind_principal(token)


def test_a_batch_takes_a_token_a_record_all_or_none() -> None:
    # Found by review: the write rate counted calls, and 100 calls a second of 1,000 records
    # each passed it. A batch now takes one token a record, all at once or none.
    clock = Clock()
    rate = RecordRate(10.0, 20, "ENGRAM_SHARD_RATE_LIMIT_RECORDS", clock)
    rate.admit("f", "a", 20)  # a full burst fits an idle bucket
    with pytest.raises(ResourceExhausted) as refused:
        rate.admit("f", "a", 5)
    assert refused.value.reason == "RATE_LIMITED"
    assert refused.value.retry_delay == pytest.approx(0.5)
    assert refused.value.metadata["kind"] == "records"
    assert refused.value.metadata["records"] == "5"
    assert "ENGRAM_SHARD_RATE_LIMIT_RECORDS" in refused.value.message
    rate.admit("f", "b", 1)  # another agent has its own bucket
    clock.now += 0.3  # 3 tokens: a batch of 5 still does not fit, and takes none of them
    with pytest.raises(ResourceExhausted):
        rate.admit("f", "a", 5)
    rate.admit("f", "a", 3)
    clock.now += 0.5
    rate.admit("f", "a", 5)  # waited what it was told: let in
    clock.now += 100
    rate.admit("f", "a", 5000)  # over the burst (refused later, too large): takes the burst
    with pytest.raises(ResourceExhausted):
        rate.admit("f", "a", 1)
    with pytest.raises(ValueError):
        RecordRate(0.0, 20, "X")


def test_the_record_interceptor_counts_agents_batches_and_lets_services_pass() -> None:
    from engram.shard.v1 import shard_service_pb2 as pb
    from services.common.interceptors import RecordRateInterceptor, Undecodable
    from services.shard.servicer import RECORDS

    clock = Clock()
    method = "/engram.shard.v1.ShardService/BatchCreateRecords"
    interceptor = RecordRateInterceptor(RecordRate(1.0, 3, "RECORDS", clock), RECORDS)
    stored: list[object] = []

    def write(request: object, _context: object) -> str:
        stored.append(request)
        return "written"

    wrapped = interceptor.wrap(write, method, False)
    batch = pb.BatchCreateRecordsRequest(records=[pb.RecordInput(content="x")] * 3)

    def call(roles: frozenset[str], request: object = batch, fleet: str = "f") -> object:
        token = bind_principal(Principal(agent_id="a", fleet_id=fleet, roles=roles))
        try:
            return wrapped(request, None)
        finally:
            unbind_principal(token)

    assert call(frozenset({"agent"})) == "written"
    with pytest.raises(ResourceExhausted):
        call(frozenset({"agent"}))
    assert len(stored) == 1  # refused before the method ran
    for _ in range(5):  # a service principal carries many agents' work
        assert call(frozenset({"service"}), fleet="system") == "written"
    with pytest.raises(ResourceExhausted):  # role service of another fleet: no service
        call(frozenset({"service"}))
    undecodable = Undecodable(ValueError("bad bytes"))
    assert call(frozenset({"agent"}), undecodable) == "written"  # TextInterceptor refuses it
    reads = "/engram.shard.v1.ShardService/GetRecord"
    assert interceptor.wrap(write, reads, False) is write


def test_the_call_rate_lets_services_pass_and_not_a_service_role_of_another_fleet() -> None:
    from services.common.interceptors import RateLimitInterceptor

    method = "/engram.shard.v1.ShardService/CreateRecord"
    limiter = RateLimiter({WRITE: (1.0, 1)}, {WRITE: "WRITES"}, Clock())
    wrapped = RateLimitInterceptor(limiter, {method: WRITE}).wrap(
        lambda _request, _context: "done", method, False)

    def call(fleet: str) -> object:
        token = bind_principal(Principal("svc-shard", fleet, frozenset({"service"})))
        try:
            return wrapped(None, None)
        finally:
            unbind_principal(token)

    assert [call("system") for _ in range(5)] == ["done"] * 5
    assert call("fleet-a") == "done"
    with pytest.raises(ResourceExhausted):  # found by review: it passed as a service did
        call("fleet-a")
