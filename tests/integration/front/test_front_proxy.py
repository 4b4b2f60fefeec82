"""The front proxy (engram/front.py) in front of a real service: calls over its limits are
refused by nginx itself with the status, reason and RetryInfo the service's own admission
sends; everything else passes through untouched (auth included)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.artifacts.v1 import artifacts_service_pb2_grpc as rpc
from engram.bench._harness import free_port
from engram.client import EngramRpcError
from engram.front import FrontLimits
from tests.conftest import TokenFactory
from tests.front import front_proxy, need_nginx
from tests.stack import GatedStack, gated_stack

LIMITS = FrontLimits(max_in_flight=3, per_caller_in_flight=2, retry_after_ms=70)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, engram_home: Path,
          make_token: TokenFactory) -> Iterator[GatedStack]:
    need_nginx()
    with (gated_stack(tmp_path_factory.mktemp("front-stack"), engram_home, make_token)
          as servers, grpc.insecure_channel(servers.artifacts.address) as channel):
        for run in ("front-run", "front-big"):
            rpc.ArtifactsServiceStub(channel).StartRun(pb.StartRunRequest(run_id=run),
                                                       metadata=_auth(make_token("front-a")))
        yield servers


@pytest.fixture(scope="module")
def front(stack: GatedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with front_proxy(stack.artifacts.address, LIMITS,
                     tmp_path_factory.mktemp("front-nginx")) as address:
        yield address


class Held:
    """Uploads that stay in flight (their request stream waits) until released."""

    def __init__(self, channel: grpc.Channel, token: str, count: int) -> None:
        self.release = threading.Event()
        self._stub = rpc.ArtifactsServiceStub(channel)
        self._token = token
        self.calls = [self._start() for _ in range(count)]

    def _start(self) -> grpc.Future:
        return self._stub.CreateArtifact.future(self._requests(), metadata=_auth(self._token),
                                                timeout=30)

    def _requests(self) -> Iterator[pb.CreateArtifactRequest]:
        yield pb.CreateArtifactRequest(header=pb.ArtifactHeader(run_id="front-run", step_id="s1",
                                                                name="held.bin"))
        self.release.wait(30)

    def renew(self) -> list[str]:
        """Start again the calls that ended before their release, and say how they ended.

        A held call can end before it is counted for reasons outside the test: the proxy
        still counting the calls an earlier test cancelled, a first connection that failed on a
        loaded machine. Without this the wait below saw every probe pass and failed without
        saying why (CI, 2026-11-30)."""
        ended = []
        for index, call in enumerate(self.calls):
            if call.done():
                error = call.exception()
                ended.append(f"{error.code().name}: {error.details()}" if isinstance(
                    error, grpc.RpcError) else f"ended: {error!r}")
                self.calls[index] = self._start()
        return ended

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *_: object) -> None:
        self.release.set()
        for call in self.calls:
            call.cancel()


def _auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _call(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
    """A unary call for an artifact no one stored: NOT_FOUND once it reaches the service."""
    rpc.ArtifactsServiceStub(channel).GetArtifact(
        pb.GetArtifactRequest(artifact_id="art_" + "0" * 32), metadata=metadata, timeout=10)


def _get(channel: grpc.Channel, token: str) -> grpc.StatusCode:
    """A unary call through the proxy; the code it ended with (NOT_FOUND: it reached the
    service, which has no such artifact)."""
    try:
        _call(channel, _auth(token))
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _refused(channel: grpc.Channel, token: str) -> EngramRpcError:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        _call(channel, _auth(token))
    assert time.monotonic() - started < 5
    return EngramRpcError.from_rpc_error(caught.value)


def _until_in_flight(channel: grpc.Channel, token: str, *held: Held) -> None:
    """Wait until the ``held`` calls are all in flight and counted: the next call of
    ``token`` is refused while none of them has ended."""
    deadline = time.monotonic() + 10
    ended: list[str] = []
    while True:
        renewed = [how for calls in held for how in calls.renew()]
        ended += renewed
        if not renewed and _get(channel, token) == grpc.StatusCode.RESOURCE_EXHAUSTED and not any(
                call.done() for calls in held for call in calls.calls):
            return
        assert time.monotonic() < deadline, (
            f"the held calls were never counted in flight; held calls that ended: {ended}")
        time.sleep(0.05)


def test_a_call_passes_through_to_the_service(front: str, make_token: TokenFactory) -> None:
    with grpc.insecure_channel(front) as channel:
        assert _get(channel, make_token("front-a")) == grpc.StatusCode.NOT_FOUND


def test_a_caller_over_its_own_limit_is_refused_and_others_are_not(
        front: str, make_token: TokenFactory) -> None:
    a, b = make_token("front-a"), make_token("front-b")
    with (grpc.insecure_channel(front) as channel,
          Held(channel, a, LIMITS.per_caller_in_flight) as held):
        _until_in_flight(channel, a, held)
        refusal = _refused(channel, a)
        assert refusal.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refusal.reason == "OVERLOADED"
        assert refusal.metadata["limit"] == "front proxy"
        assert refusal.retry_delay == pytest.approx(0.070)
        assert "retry after the delay" in refusal.message
        # Another token is another caller: under the total (2 held + 1), it passes.
        assert _get(channel, b) == grpc.StatusCode.NOT_FOUND
    with grpc.insecure_channel(front) as channel:
        deadline = time.monotonic() + 10
        while _get(channel, a) != grpc.StatusCode.NOT_FOUND:  # the slots come back
            assert time.monotonic() < deadline, "the caller's slots did not come back"
            time.sleep(0.05)


def test_the_total_is_shared_by_every_caller(front: str, make_token: TokenFactory) -> None:
    a, b, c = (make_token(f"front-{who}") for who in "abc")
    with (grpc.insecure_channel(front) as channel,
          Held(channel, a, 2) as held_a, Held(channel, b, 1) as held_b):
        # 3 held of 3: c, with nothing in flight, is refused
        _until_in_flight(channel, c, held_a, held_b)
        assert _refused(channel, c).reason == "OVERLOADED"


def test_authentication_is_still_the_services(front: str, make_token: TokenFactory) -> None:
    forged = make_token("front-a")[:-8] + "AAAAAAAA"
    with grpc.insecure_channel(front) as channel:
        assert _get(channel, forged) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            _call(channel, ())
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_message_past_nginx_default_body_size_passes(front: str,
                                                       make_token: TokenFactory) -> None:
    """nginx refuses request bodies over 1 MB by default; the service sets its own limit."""
    blob = bytes(range(256)) * (3 * 4096)  # 3 MiB
    def requests() -> Iterator[pb.CreateArtifactRequest]:
        yield pb.CreateArtifactRequest(header=pb.ArtifactHeader(run_id="front-big", step_id="s1",
                                                                name="big.bin"))
        for start in range(0, len(blob), 1 << 20):
            yield pb.CreateArtifactRequest(chunk=blob[start:start + (1 << 20)])
        yield pb.CreateArtifactRequest(trailer=pb.ArtifactTrailer(
            size_bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest()))

    with grpc.insecure_channel(front) as channel:
        stored = rpc.ArtifactsServiceStub(channel).CreateArtifact(
            requests(), metadata=_auth(make_token("front-big")), timeout=30)
    assert stored.artifact.size_bytes == len(blob)


def test_a_service_that_does_not_answer_is_unavailable(tmp_path: Path,
                                                       make_token: TokenFactory) -> None:
    with (front_proxy(f"127.0.0.1:{free_port()}", LIMITS, tmp_path) as address,
          grpc.insecure_channel(address) as channel):
        assert _get(channel, make_token("front-a")) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("real_first", [True, False])
def test_two_authorization_headers_are_refused_directly_and_through_the_proxy(
        stack: GatedStack, front: str, make_token: TokenFactory, real_first: bool) -> None:
    """Which of two headers counts depends on who reads them: the service's dict kept the
    last, nginx keys callers by the first, so a caller rotating a made-up first header beside
    its real token was a new caller to the proxy's limits on every call. The service refuses
    the pair UNAUTHENTICATED TOKEN_AMBIGUOUS; nginx refuses it itself, INVALID_ARGUMENT (an
    HTTP 400 a client would report as INTERNAL without the mapping)."""
    real, made_up = f"Bearer {make_token('front-a')}", "Bearer " + "x" * 80
    headers = ((real, made_up) if real_first else (made_up, real))
    metadata = tuple(("authorization", value) for value in headers)
    for address, code in ((stack.artifacts.address, grpc.StatusCode.UNAUTHENTICATED),
                          (front, grpc.StatusCode.INVALID_ARGUMENT)):
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
            _call(channel, metadata)
        error = EngramRpcError.from_rpc_error(caught.value)
        assert error.code == code, (address, error)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            assert error.reason == "TOKEN_AMBIGUOUS"
        assert "exactly one 'authorization: Bearer <token>'" in error.message


def test_one_token_spelled_differently_is_still_one_caller(front: str,
                                                          make_token: TokenFactory) -> None:
    """The service accepts a token with trailing spaces or with '==' after its signature; to
    the proxy each spelling was a caller of its own (the key was the header's last 64
    characters), so one agent could hold its limit once per spelling."""
    a = make_token("front-a")
    with (grpc.insecure_channel(front) as channel,
          Held(channel, a, LIMITS.per_caller_in_flight) as held):
        _until_in_flight(channel, a, held)
        for spelling in (a + "   ", a + "==", a + "== "):
            assert _refused(channel, spelling).reason == "OVERLOADED", repr(spelling[-4:])


@pytest.mark.parametrize("size", [9_000, 40_000])
def test_a_large_header_ends_only_its_own_call_as_the_service_answers_it(
        stack: GatedStack, front: str, make_token: TokenFactory, size: int) -> None:
    """nginx's default header buffers answered a 9 KB metadata value with GOAWAY: every call on
    the connection ended UNAVAILABLE (found in review). Through the proxy the call now ends
    as the service answers it, and a call beside it on the same channel is not hurt."""
    token = make_token("front-a")
    metadata = (*_auth(token), ("x-engram-note", "n" * size))

    def outcome(address: str) -> grpc.StatusCode:
        with grpc.insecure_channel(address) as channel:
            beside = rpc.ArtifactsServiceStub(channel).GetArtifact.future(
                pb.GetArtifactRequest(artifact_id="art_" + "1" * 32), metadata=_auth(token),
                timeout=10)
            try:
                _call(channel, metadata)
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
            with pytest.raises(grpc.RpcError) as other:
                beside.result()
            assert other.value.code() == grpc.StatusCode.NOT_FOUND
            return code  # type: ignore[no-any-return]

    # The service's own metadata limit is checked on the header as encoded, and nginx
    # Huffman-codes what grpc-python sends raw, so the two may differ in which side of the
    # limit a value falls; what matters is that the call ends as the service answers it.
    assert outcome(front) in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert outcome(stack.artifacts.address) in (grpc.StatusCode.NOT_FOUND,
                                                grpc.StatusCode.RESOURCE_EXHAUSTED)
