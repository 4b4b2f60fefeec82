"""Uploads that stop sending hold a call slot each: they count against the agent's and the
fleet's stream limits, so one agent cannot take every slot of the service (found by a review
on 2026-11-29: 16 stalled CreateArtifact calls of one agent left every other fleet
RESOURCE_EXHAUSTED CONCURRENCY_LIMIT)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from tests.integration.artifacts.conftest import running_artifacts


def _stalled(client: ArtifactsClient, release: threading.Event, name: str) -> Any:
    """A CreateArtifact that sends its header and one chunk, then nothing until ``release``."""
    def requests() -> Iterator[pb.CreateArtifactRequest]:
        yield pb.CreateArtifactRequest(header=pb.ArtifactHeader(
            run_id="run-1", step_id="s", name=name))
        yield pb.CreateArtifactRequest(chunk=b"x" * 1024)
        release.wait(60)

    return client.stub.CreateArtifact.future(requests(), metadata=client.metadata, timeout=60)


def _ended(call: Any, code: grpc.StatusCode, reason: str) -> EngramRpcError:
    """The error an upload's call ended with (within 10 s), checked to be ``code``/``reason``."""
    with pytest.raises(grpc.RpcError) as failure:
        call.result(timeout=10)
    error = EngramRpcError.from_rpc_error(failure.value)
    assert (error.code, error.reason) == (code, reason)
    return error


def test_one_agents_stalled_uploads_stop_at_its_limit_and_others_get_in(
        tmp_path: Path, engram_home: Path, make_token: Callable[..., str]) -> None:
    release = threading.Event()
    held: list[Any] = []
    with running_artifacts(f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "blobs", engram_home,
                           make_token, max_concurrent_rpcs=8,
                           max_streams_per_agent=2) as running:
        attacker = running.client_for("fleet-a", "agent-1")
        other = running.client_for("fleet-b", "agent-2")
        other.max_retries = 0
        try:
            attacker.start_run("run-1")
            held = [_stalled(attacker, release, f"f{i}") for i in range(2)]
            for call in held:  # still sending: neither has ended
                with pytest.raises(grpc.FutureTimeoutError):
                    call.result(timeout=0.5)
            error = _ended(_stalled(attacker, release, "f2"),
                           grpc.StatusCode.RESOURCE_EXHAUSTED, "STREAM_LIMIT")
            assert error.metadata["scope"] == "agent"
            for call in held:  # the uploads under way go on
                assert not call.done()
            for _ in range(10):  # every other fleet's calls still get a slot
                with pytest.raises(EngramRpcError) as missing:
                    other.get_run("no-such-run")
                assert missing.value.code == grpc.StatusCode.NOT_FOUND
        finally:
            release.set()
            for call in held:
                call.cancel()


def test_an_upload_that_sends_nothing_is_ended_and_its_place_given_back(
        tmp_path: Path, engram_home: Path, make_token: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """UPLOAD_IDLE_SECONDS (60 in service, 1 here): a stalled upload is ended DEADLINE_EXCEEDED
    UPLOAD_IDLE, nothing stored, and the agent's place comes back."""
    from services.common import interceptors

    monkeypatch.setattr(interceptors, "UPLOAD_IDLE_SECONDS", 1.0)
    release = threading.Event()
    with running_artifacts(f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "blobs", engram_home,
                           make_token, max_streams_per_agent=1) as running:
        agent = running.client_for("fleet-a", "agent-1")
        agent.start_run("run-1")
        try:
            _ended(_stalled(agent, release, "idle.bin"), grpc.StatusCode.DEADLINE_EXCEEDED,
                   "UPLOAD_IDLE")
            assert list(agent.list_artifacts("run-1")) == []
            stored = agent.upload(iter([b"a whole upload"]), run_id="run-1", step_id="s",
                                  name="next.bin")  # its one place is free again
            assert stored.size_bytes == len(b"a whole upload")
        finally:
            release.set()
