"""Artifacts' page tokens are signed and bound to the caller: forged or borrowed ones fail."""

from __future__ import annotations

import base64
import hashlib
import json

import grpc
import pytest

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from tests.integration.artifacts.conftest import RunningArtifacts


def _refused(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EngramRpcError) as caught:
        call()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert caught.value.reason == "INVALID_PAGE_TOKEN", caught.value


def test_forged_and_other_callers_page_tokens_are_refused(
        artifacts_server: RunningArtifacts) -> None:
    alice = artifacts_server.client_for("fleet-a", "alice")
    bob = artifacts_server.client_for("fleet-a", "bob")
    for n in range(3):
        alice.start_run(f"run-{n}")
    digest = hashlib.sha256(json.dumps({"fleet": "fleet-a"}, sort_keys=True,
                                       separators=(",", ":")).encode()).hexdigest()[:16]
    forged = base64.urlsafe_b64encode(
        json.dumps({"k": ["x"], "f": digest}).encode()).decode().rstrip("=")

    def page(client: ArtifactsClient, token: str) -> pb.ListRunsResponse:
        return client.call(client.stub.ListRuns, pb.ListRunsRequest(page_size=2,
                                                                    page_token=token))

    _refused(lambda: page(alice, forged))
    token = page(alice, "").next_page_token
    assert len(page(alice, token).runs) == 1
    _refused(lambda: page(bob, token))
