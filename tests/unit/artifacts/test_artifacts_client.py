"""ArtifactsClient.download checks size and SHA-256 itself, over real gRPC.

The server here streams fixed bytes without checking them (as a proxy or an older server
might), so what is tested is the client's own check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.artifacts.v1 import artifacts_service_pb2_grpc as pb_grpc
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient

STORED = b"hello artifact"


class _UncheckedReads(pb_grpc.ArtifactsServiceServicer):
    """Announces STORED's size and hash, then streams whatever ``sent`` holds."""

    def __init__(self) -> None:
        self.sent = [STORED]

    def ReadArtifact(self, request: pb.ReadArtifactRequest,
                     context: grpc.ServicerContext) -> Iterator[pb.ReadArtifactResponse]:
        yield pb.ReadArtifactResponse(artifact=pb.Artifact(
            artifact_id=request.artifact_id, path="runs/r/s/report.txt",
            size_bytes=len(STORED), hash=hashlib.sha256(STORED).hexdigest()))
        for chunk in self.sent:
            yield pb.ReadArtifactResponse(chunk=chunk)


@pytest.fixture
def served() -> Iterator[tuple[_UncheckedReads, ArtifactsClient]]:
    servicer = _UncheckedReads()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ArtifactsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = ArtifactsClient(f"127.0.0.1:{port}", "unused")
    yield servicer, client
    client.close()
    server.stop(0)


def test_download_writes_the_file_and_reports_progress(
        served: tuple[_UncheckedReads, ArtifactsClient], tmp_path: Path) -> None:
    servicer, client = served
    servicer.sent = [STORED[:5], STORED[5:]]
    seen: list[int] = []
    destination = tmp_path / "out.txt"
    artifact = client.download("a-1", destination, progress=lambda _a, n: seen.append(n))
    assert destination.read_bytes() == STORED and artifact.artifact_id == "a-1"
    assert seen == [0, 5, len(STORED)]


@pytest.mark.parametrize("sent", [[b"hello artifacX"], [STORED[:5]], [STORED, b"!"]])
def test_bytes_that_do_not_match_the_artifact_are_never_renamed_into_place(
        served: tuple[_UncheckedReads, ArtifactsClient], tmp_path: Path,
        sent: list[bytes]) -> None:
    servicer, client = served
    servicer.sent = sent
    destination = tmp_path / "out.txt"
    with pytest.raises(EngramRpcError) as caught:
        client.download("a-1", destination)
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.DATA_LOSS,
                                                        "DOWNLOAD_MISMATCH")
    assert list(tmp_path.iterdir()) == []
