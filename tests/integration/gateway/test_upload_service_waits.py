"""An upload whose artifacts service is slow, behind the gateway.

- A service slower than its client kept the feed queue full, and the event loop polled it
  every 2 ms; it now waits for the service to take a part.

The artifacts service here is a real gRPC server on 127.0.0.1:0 whose CreateArtifact the test
steers; the gateway in front of it is the real one.
"""

from __future__ import annotations

import hashlib
import os
import queue
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
