"""README: every call has a deadline (`timeout`, 30 s by default) except the artifacts
client's streams, which take `stream_timeout` (none by default); past its deadline a call
raises `EngramRpcError` with DEADLINE_EXCEEDED. A real gRPC server on loopback records the
deadline each call arrives with."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.artifacts.v1 import artifacts_service_pb2_grpc as pb_grpc
from engram.cli import _output as output
from engram.cli.main import app
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import POLICY_RUN_SECONDS, CompactorClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.compactor.v1 import compactor_service_pb2_grpc as cpb_grpc


class Recording(pb_grpc.ArtifactsServiceServicer):
    def __init__(self) -> None:
        self.remaining: dict[str, float | None] = {}
        self.pause = 0.0
        """Seconds ReadArtifact waits before each chunk (a slow download)."""

    def GetRun(self, request: pb.GetRunRequest, context: Any) -> pb.GetRunResponse:
        self.remaining["GetRun"] = context.time_remaining()
        return pb.GetRunResponse(run=pb.Run(run_id=request.run_id))

    def ReadArtifact(self, request: pb.ReadArtifactRequest,
                     context: Any) -> Iterator[pb.ReadArtifactResponse]:
        self.remaining["ReadArtifact"] = context.time_remaining()
        yield pb.ReadArtifactResponse(artifact=pb.Artifact(artifact_id=request.artifact_id))
        for _ in range(5 if self.pause else 1):
            if context.is_active():
                time.sleep(self.pause)
                yield pb.ReadArtifactResponse(chunk=b"bytes")


@pytest.fixture
def served() -> Iterator[tuple[str, Recording]]:
    recording = Recording()  # type: ignore[abstract]  # only the two methods it records
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ArtifactsServiceServicer_to_server(recording, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", recording
    server.stop(0)


def _read(client: ArtifactsClient) -> bytes:
    _artifact, chunks = client.read("art_1")
    return b"".join(chunks)


def test_a_unary_call_carries_the_30_s_default_and_a_stream_none_unless_set(
        served: tuple[str, Recording]) -> None:
    address, recording = served
    with ArtifactsClient(address, "token") as client:
        client.get_run("run-1")
        assert _read(client) == b"bytes"
    unary, stream = recording.remaining["GetRun"], recording.remaining["ReadArtifact"]
    assert unary is not None and 25 < unary <= 31  # gRPC rounds a sent timeout up
    # A download of a large artifact outlives any fixed deadline: none unless one is given
    # (gRPC tells the server "no deadline" as a time remaining of about 292 years).
    assert stream is None or stream > 1e9


def test_the_timeouts_given_are_the_deadlines_sent(served: tuple[str, Recording]) -> None:
    address, recording = served
    with ArtifactsClient(address, "token", timeout=5, stream_timeout=120) as client:
        client.get_run("run-1")
        assert _read(client) == b"bytes"
    unary, stream = recording.remaining["GetRun"], recording.remaining["ReadArtifact"]
    assert unary is not None and 3 < unary <= 6
    assert stream is not None and 115 < stream <= 121


def test_a_stream_past_its_stream_timeout_ends_deadline_exceeded(
        served: tuple[str, Recording]) -> None:
    """The download has begun (the artifact and a chunk arrived) when the deadline passes:
    the rest of it is cut off, as the SDK's error with DEADLINE_EXCEEDED."""
    address, recording = served
    # The first chunk comes 0.6 s in, the deadline at 1.5 s, the whole stream would take 3 s:
    # wide margins on a loaded machine (0.3 s of 0.5 left 0.2 s for the first chunk).
    recording.pause = 0.6
    with ArtifactsClient(address, "token", stream_timeout=1.5) as client:
        started = time.monotonic()
        artifact, chunks = client.read("art_1")
        assert artifact.artifact_id == "art_1"
        assert next(chunks) == b"bytes"
        with pytest.raises(EngramRpcError) as failure:
            list(chunks)
        assert failure.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 2.7  # cut at the deadline, not after the stream (3 s)


class PolicyRecording(cpb_grpc.CompactorServiceServicer):
    def __init__(self) -> None:
        self.remaining: dict[str, float | None] = {}

    def CompactMemory(self, request: cpb.CompactMemoryRequest,
                      context: Any) -> cpb.CompactMemoryResponse:
        self.remaining["CompactMemory"] = context.time_remaining()
        return cpb.CompactMemoryResponse()

    def ApplyMemoryRetention(self, request: cpb.ApplyMemoryRetentionRequest,
                             context: Any) -> cpb.ApplyMemoryRetentionResponse:
        self.remaining["ApplyMemoryRetention"] = context.time_remaining()
        return cpb.ApplyMemoryRetentionResponse()


def test_an_on_demand_policy_run_waits_longer_than_the_compactor_does() -> None:
    """The compactor waits up to 60 s for each shard call; a compaction past the caller's 30 s
    finished and was recorded as succeeded while the caller was told DEADLINE_EXCEEDED (found
    in review, 2026-11-30). Compaction and retention take at least POLICY_RUN_SECONDS."""
    recording = PolicyRecording()  # type: ignore[abstract]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    cpb_grpc.add_CompactorServiceServicer_to_server(recording, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with CompactorClient(f"127.0.0.1:{port}", "token", timeout=30) as client:
            client.compact_memory("fleet-a")
            client.apply_retention("fleet-a", older_than_days=30)
        for method in ("CompactMemory", "ApplyMemoryRetention"):
            remaining = recording.remaining[method]
            assert remaining is not None and POLICY_RUN_SECONDS - 5 < remaining <= \
                POLICY_RUN_SECONDS + 1, method  # (grpc rounds the deadline it sends)
        with CompactorClient(f"127.0.0.1:{port}", "token", timeout=None) as client:
            client.compact_memory("fleet-a")  # no deadline asked: none
        assert recording.remaining["CompactMemory"] is None or \
            recording.remaining["CompactMemory"] > 1e6
    finally:
        server.stop(0)


def test_a_policy_run_past_its_deadline_says_where_to_see_it_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def too_slow(self: CompactorClient, *args: Any, **kwargs: Any) -> None:
        raise EngramRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    monkeypatch.setattr(CompactorClient, "compact_memory", too_slow)
    monkeypatch.setenv("ENGRAM_TOKEN", "token")
    monkeypatch.setattr(output, "_settings", None)  # read again, and forgotten after
    result = CliRunner().invoke(app, ["compactor", "compact-memory"])
    said = " ".join((result.output + (result.stderr if result.stderr_bytes else "")).split())
    assert result.exit_code == 2, said
    assert "the run may still finish in the compactor: see `engram compactor policy-runs`" \
        in said
