"""An upload whose artifacts service is slow or stalls, behind the gateway.

- A service that took the whole body and then never answered held the upload's thread and
  its place (``--uploads-max``) for good: the gateway now waits at most
  ``upload_answer_seconds`` for it, then cancels the call and answers 504
  ``UPLOAD_ANSWER_TIMEOUT``.
- A service slower than its client kept the feed queue full, and the event loop polled it
  every 2 ms; it now waits for the service to take a part.

The artifacts service here is a real gRPC server on 127.0.0.1:0 whose CreateArtifact the test
steers; the gateway in front of it is the real one.
"""

from __future__ import annotations

import hashlib
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import requests

from engram.artifacts.v1 import artifacts_service_pb2 as artifacts_pb
from engram.gateway import Gateway, GatewayConfig, _app
from tests.integration.gateway.conftest import GatewayThread, Stack

pytestmark = pytest.mark.slow


class _SteeredArtifacts:
    """CreateArtifact reads the whole stream (``per_part`` seconds per message), checks the
    trailer against what came, then answers at once or, when ``hold``, only once the test
    releases it (or the call is cancelled). With ``stall_reading`` it stops reading after the
    header instead, until released or cancelled."""

    def __init__(self, *, hold: bool, per_part: float = 0.0,
                 stall_reading: bool = False) -> None:
        self.hold, self.per_part, self.stall_reading = hold, per_part, stall_reading
        self.release = threading.Event()
        self.cancelled = threading.Event()
        self.read_whole = threading.Event()
        self.parts = 0
        self.received = ""
        """The SHA-256 (hex) of the last call's bytes."""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.stream_unary_rpc_method_handler(
            self._create, request_deserializer=artifacts_pb.CreateArtifactRequest.FromString,
            response_serializer=artifacts_pb.CreateArtifactResponse.SerializeToString)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "engram.artifacts.v1.ArtifactsService", {"CreateArtifact": handler}),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    def _create(self, parts: Iterator[artifacts_pb.CreateArtifactRequest],
                context: grpc.ServicerContext) -> artifacts_pb.CreateArtifactResponse:
        size, trailer, received = 0, None, hashlib.sha256()
        for part in parts:
            self.parts += 1
            if part.WhichOneof("part") == "chunk":
                size += len(part.chunk)
                received.update(part.chunk)
            elif part.WhichOneof("part") == "trailer":
                trailer = part.trailer
            time.sleep(self.per_part)
            while self.stall_reading and not self.release.is_set() and context.is_active():
                time.sleep(0.02)
            if not context.is_active():
                self.cancelled.set()
                return artifacts_pb.CreateArtifactResponse()
        self.received = received.hexdigest()
        if trailer is None or (trailer.size_bytes, trailer.sha256) != (size, self.received):
            context.abort(grpc.StatusCode.DATA_LOSS, f"the stream ended short of its trailer "
                          f"({size} bytes, trailer {trailer})")
        self.read_whole.set()
        while self.hold and not self.release.is_set() and context.is_active():
            time.sleep(0.02)
        if not context.is_active():
            self.cancelled.set()
        return artifacts_pb.CreateArtifactResponse(artifact=artifacts_pb.Artifact(
            artifact_id="a-1", hash=self.received, size_bytes=size))


def _upload(url: str, stack: Stack, blob: bytes, timeout: float) -> requests.Response:
    token = stack.tokens("uploader", "fleet-gw", ("agent",))
    return requests.post(f"{url}/v1/runs/run-held/artifacts",
                         headers={"Authorization": f"Bearer {token}"},
                         params={"step_id": "s", "name": "held.bin"}, data=blob,
                         timeout=timeout)


def test_an_upload_whose_service_never_answers_is_504_and_gives_its_place_back(
        stack: Stack) -> None:
    """The service takes the whole body, then answers nothing: with a 1 s answer limit the
    upload is 504 DEADLINE_EXCEEDED (UPLOAD_ANSWER_TIMEOUT), the service sees its call
    cancelled, no upload is left running, and the next upload (with --uploads-max 1) is let
    in, not UPLOADS_BUSY. Checked failing without the limit: no answer in the 10 s the
    request waited."""
    artifacts = _SteeredArtifacts(hold=True)
    artifacts.server.start()
    try:
        gateway = Gateway(GatewayConfig({**stack.addresses, "artifacts": artifacts.address},
                                        timeout_seconds=10.0, uploads_max=1,
                                        upload_answer_seconds=1.0))
        with GatewayThread(gateway) as url:
            began = time.monotonic()
            answer = _upload(url, stack, b"x" * 100_000, timeout=10)
            took = time.monotonic() - began
            assert answer.status_code == 504, answer.text
            status = answer.json()
            assert status["code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
            assert status["details"][0]["reason"] == "UPLOAD_ANSWER_TIMEOUT"
            assert "artifacts service" in status["message"], status
            assert "within 1 s" in status["message"] and "cancelled" in status["message"]
            assert status["details"][0]["metadata"] == {"service": "artifacts",
                                                        "timeout_seconds": "1"}
            assert artifacts.read_whole.is_set() and took < 5, took
            assert artifacts.cancelled.wait(5), "the gateway did not cancel the held call"
            assert gateway._uploads_running == 0 and not gateway._uploads
            artifacts.cancelled.clear()
            again = _upload(url, stack, b"y" * 1000, timeout=10)
            assert again.status_code == 504, again.text  # let in (not 503), held again
            assert again.json()["details"][0]["reason"] == "UPLOAD_ANSWER_TIMEOUT"
            assert artifacts.cancelled.wait(5)
    finally:
        artifacts.release.set()
        artifacts.server.stop(0)


def test_a_service_that_answers_within_the_limit_is_served(stack: Stack) -> None:
    """The same held service released after 0.3 s, inside a 5 s answer limit: 200."""
    artifacts = _SteeredArtifacts(hold=True)
    artifacts.server.start()
    try:
        config = GatewayConfig({**stack.addresses, "artifacts": artifacts.address},
                               timeout_seconds=10.0, upload_answer_seconds=5.0)
        with GatewayThread(Gateway(config)) as url:
            threading.Timer(0.3, artifacts.release.set).start()
            answer = _upload(url, stack, b"z" * 5000, timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.json()["artifact"]["sizeBytes"] == "5000"
        assert not artifacts.cancelled.is_set()
    finally:
        artifacts.release.set()
        artifacts.server.stop(0)


def test_an_upload_whose_client_goes_while_its_service_stalls_is_cancelled(
        stack: Stack) -> None:
    """The service stops reading after the header; the client sends part of its body and
    goes. The gateway cancels the call at once rather than leave an upload thread waiting on
    the stalled service (up to the answer limit, 60 s here). Checked failing without the
    cancel: the service's call was still active 5 s later."""
    artifacts = _SteeredArtifacts(hold=False, stall_reading=True)
    artifacts.server.start()
    try:
        gateway = Gateway(GatewayConfig({**stack.addresses, "artifacts": artifacts.address},
                                        timeout_seconds=10.0, upload_answer_seconds=60.0))
        with GatewayThread(gateway) as url:
            token = stack.tokens("uploader", "fleet-gw", ("agent",))
            host, port = url.removeprefix("http://").split(":")
            head = (f"POST /v1/runs/run-gone/artifacts?step_id=s&name=gone.bin HTTP/1.1\r\n"
                    f"Host: {host}\r\nAuthorization: Bearer {token}\r\n"
                    "Content-Length: 1000000\r\n\r\n").encode()
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                conn.sendall(head + b"x" * 1000)
                time.sleep(0.3)
            assert artifacts.cancelled.wait(5), "the stalled call was left running"
            deadline = time.monotonic() + 5
            while gateway._uploads_running and time.monotonic() < deadline:
                time.sleep(0.02)
            assert gateway._uploads_running == 0
    finally:
        artifacts.release.set()
        artifacts.server.stop(0)


class _CountingQueue(queue.Queue[Any]):
    """The feed queue, counting the gateway's attempts to put a part into it."""

    attempts = 0

    def put_nowait(self, item: Any) -> None:
        type(self).attempts += 1
        super().put_nowait(item)


def test_a_slow_service_gets_every_byte_and_the_loop_does_not_poll(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service taking a part every 30 ms behind a fast client: the feed queue stays full,
    yet the service receives every byte (the hash matches), and the gateway tries to put a
    part at most twice per part taken (once, and once more after the service's wake-up).
    Checked failing with the 2 ms poll: 260 attempts for the 35 parts taken."""
    monkeypatch.setattr(_app, "queue", SimpleNamespace(
        Queue=_CountingQueue, Full=queue.Full, Empty=queue.Empty))
    monkeypatch.setattr(_CountingQueue, "attempts", 0)
    artifacts = _SteeredArtifacts(hold=False, per_part=0.03)
    artifacts.server.start()
    blob = os.urandom(8 * 1024 * 1024)
    try:
        config = GatewayConfig({**stack.addresses, "artifacts": artifacts.address},
                               timeout_seconds=10.0)
        with GatewayThread(Gateway(config)) as url:
            answer = _upload(url, stack, blob, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["artifact"]["hash"] == hashlib.sha256(blob).hexdigest()
        assert artifacts.received == hashlib.sha256(blob).hexdigest()
        assert artifacts.parts > 3 * _app.UPLOAD_QUEUE  # the queue was full for a while
        assert _CountingQueue.attempts <= 2 * artifacts.parts + 4, (
            _CountingQueue.attempts, artifacts.parts)
    finally:
        artifacts.server.stop(0)
