"""The embedding service refuses revoked tokens as every service does: it polls governance
(ENGRAM_EMBEDDER_GOVERNANCE_ADDR) for revocations, real servers on 127.0.0.1
(docs/embedder.md, docs/security.md "How they propagate, and the bound")."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram.client.governance import GovernanceClient
from engram.embedder.v1 import embedder_service_pb2 as pb
from engram.embedder.v1 import embedder_service_pb2_grpc as pb_grpc
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.embedder.server import build_embedder_server
from services.embedder.settings import EmbedderSettings
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from tests.conftest import TokenFactory, inspect_token
from tests.integration.common.stack import Outcome, reason_of

ServiceToken = Callable[[str], str]
REFRESH_SECONDS = 0.5
BOUND = REFRESH_SECONDS + 1.0
"""Refresh interval plus one call, plus a second of slack (as the other services' tests)."""
OK: Outcome = (grpc.StatusCode.OK, "")
REVOKED: Outcome = (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_REVOKED")


@pytest.fixture
def governance(tmp_path: Path, engram_home: Path) -> Iterator[EngramServer]:
    server = build_governance_server(GovernanceSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'governance.db'}",
        auth_restrictions_refresh_seconds=REFRESH_SECONDS)).start()
    try:
        yield server
    finally:
        server.stop(0)


def _embedder_token(tmp_path: Path, make_token: TokenFactory) -> Path:
    """The embedder's own service token: it only reads governance's restrictions."""
    path = tmp_path / "embedder.token"
    write_token_file(path, make_token("svc-embedder", "system", ("service",),
                                      audience=("governance",)))
    return path


def _embedder(engram_home: Path, **settings: Any) -> EngramServer:
    return build_embedder_server(EmbedderSettings(
        home=engram_home, port=0, embedder="hash", allow_test_embedder=True,
        auth_restrictions_refresh_seconds=REFRESH_SECONDS, **settings)).start()


@pytest.fixture
def embedder(governance: EngramServer, tmp_path: Path, engram_home: Path,
             make_token: TokenFactory) -> Iterator[EngramServer]:
    server = _embedder(engram_home, governance_addr=governance.address,
                       service_token_file=_embedder_token(tmp_path, make_token))
    try:
        yield server
    finally:
        server.stop(0)


@pytest.fixture
def governor(governance: EngramServer, make_token: TokenFactory) -> Iterator[GovernanceClient]:
    """A governor of the service principals' fleet (a revocation is its fleet's alone)."""
    with GovernanceClient(governance.address,
                          make_token("ops", "system", ("governor",))) as client:
        yield client


def _call(server: EngramServer, token: str, method: str = "Embed") -> Outcome:
    requests = {"Embed": pb.EmbedRequest(texts=["a lighthouse on the cliff"]),
                "Describe": pb.DescribeRequest()}
    with grpc.insecure_channel(server.address) as channel:
        rpc = getattr(pb_grpc.EmbedderServiceStub(channel), method)
        try:
            rpc(requests[method], metadata=[("authorization", f"Bearer {token}")], timeout=10)
        except grpc.RpcError as error:
            return error.code(), reason_of(error)
    return OK


def _until(server: EngramServer, token: str, expected: Outcome) -> None:
    start = time.monotonic()
    while (outcome := _call(server, token)) != expected:
        elapsed = time.monotonic() - start
        assert elapsed <= BOUND, f"the embedder still answers {outcome} after {elapsed:.1f}s"
        time.sleep(0.05)


def test_a_revoked_shard_token_is_refused_and_an_unrevoked_one_works(
        embedder: EngramServer, governor: GovernanceClient,
        make_service_token: ServiceToken) -> None:
    token, other = make_service_token("shard"), make_service_token("shard")
    for method in ("Embed", "Describe"):
        assert _call(embedder, token, method) == OK, method
        assert _call(embedder, other, method) == OK, method
    claims = inspect_token(token)["claims"]
    reply = governor.revoke_token(claims["jti"], datetime.fromtimestamp(claims["exp"], UTC),
                                  agent_id="svc-shard", reason="leaked from a shard pod")
    assert reply.created and reply.revoked.fleet_id == "system"
    _until(embedder, token, REVOKED)
    assert _call(embedder, token, "Describe") == REVOKED
    for method in ("Embed", "Describe"):
        assert _call(embedder, other, method) == OK, "only that one token is revoked"


def test_revoking_the_shards_identity_refuses_its_older_tokens(
        embedder: EngramServer, governor: GovernanceClient,
        make_service_token: ServiceToken) -> None:
    token = make_service_token("shard")
    assert _call(embedder, token) == OK
    governor.revoke_agent_tokens("svc-shard", reason="a shard host was compromised")
    _until(embedder, token, REVOKED)
    time.sleep(1.05)  # tokens issued in the second of the revocation are refused too
    assert _call(embedder, make_service_token("shard")) == OK, "a token minted after it works"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_before_governance_answers_calls_are_refused_and_health_waits(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        make_service_token: ServiceToken, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold start with governance down reopens no revoked token: every call is UNAVAILABLE
    ACCESS_RESTRICTIONS_UNKNOWN (clients retry it) and health stays NOT_SERVING."""
    monkeypatch.setattr("services.common.server.WARM_UP_WAIT_SECONDS", 0.5)
    server = _embedder(engram_home, governance_addr=f"127.0.0.1:{_free_port()}",
                       service_token_file=_embedder_token(tmp_path, make_token))
    try:
        assert _call(server, make_service_token("shard")) == (
            grpc.StatusCode.UNAVAILABLE, "ACCESS_RESTRICTIONS_UNKNOWN")
        with grpc.insecure_channel(server.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        server.stop(0)


def test_a_missing_token_file_fails_the_start_naming_the_setting(
        tmp_path: Path, engram_home: Path) -> None:
    with pytest.raises(FileNotFoundError, match="ENGRAM_EMBEDDER_SERVICE_TOKEN_FILE"):
        _embedder(engram_home, governance_addr="127.0.0.1:1",
                  service_token_file=tmp_path / "absent.token")


def test_without_governance_it_warns_that_revoked_tokens_are_not_refused(
        engram_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engram.access"):
        server = _embedder(engram_home)
    server.stop(0)
    assert any("ENGRAM_EMBEDDER_GOVERNANCE_ADDR is not set" in r.getMessage()
               and "NOT refused" in r.getMessage() for r in caplog.records)
