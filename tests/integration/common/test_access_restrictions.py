"""Revocation and suspension, held by governance and honoured by every service (four real
servers on loopback, wired as `engram up` wires them) within the stated bound."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import sqlalchemy

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.governance import GovernanceClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb
from tests.conftest import TokenFactory, inspect_token
from tests.integration.common.stack import SERVICES, Outcome, Stack, running_stack

OK = (grpc.StatusCode.OK, "")
REFRESH_SECONDS = 0.5
BOUND = REFRESH_SECONDS + 1.0
"""Refresh interval plus one call: what docs/security.md promises, plus a second of slack."""
REVOKED = (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_REVOKED")
SUSPENDED = (grpc.StatusCode.PERMISSION_DENIED, "AGENT_SUSPENDED")


@pytest.fixture
def stack(tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> Iterator[Stack]:
    refresh = {"auth_restrictions_refresh_seconds": REFRESH_SECONDS}
    with running_stack(tmp_path, engram_home, make_token, settings=lambda _s: refresh) as running:
        yield running


@pytest.fixture
def governor(stack: Stack, make_token: TokenFactory) -> Iterator[GovernanceClient]:
    with GovernanceClient(stack.address("governance"),
                          make_token("ops", "fleet-a", ("governor",))) as client:
        yield client


def _until(service: str, stack: Stack, token: str, expected: Outcome) -> float:
    """Poll ``service`` with ``token`` until it answers ``expected``; the seconds it took."""
    start = time.monotonic()
    while True:
        outcome = stack.probe(service, token)
        elapsed = time.monotonic() - start
        if outcome == expected:
            return elapsed
        assert elapsed <= BOUND, f"{service} still answers {outcome} after {elapsed:.1f}s"
        time.sleep(0.05)


def test_a_revoked_token_is_refused_by_every_service_within_the_bound(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    token, other = make_token("agent-1", "fleet-a"), make_token("agent-1", "fleet-a")
    for service in SERVICES:
        assert stack.probe(service, token) == OK, service
    claims = inspect_token(token)["claims"]
    reply = governor.revoke_token(claims["jti"], datetime.fromtimestamp(claims["exp"], UTC),
                                  agent_id="agent-1", reason="leaked in a log")
    assert reply.created and reply.revoked.revoked_by == "ops"
    assert not governor.revoke_token(claims["jti"],
                                     datetime.fromtimestamp(claims["exp"], UTC)).created
    for service in SERVICES:
        _until(service, stack, token, REVOKED)
        assert stack.probe(service, other) == OK, "only that one token is revoked"


def test_a_revocation_is_its_fleets_alone(stack: Stack, governor: GovernanceClient,
                                          make_token: TokenFactory) -> None:
    """Found by review: revocations were keyed by the jti alone. Fleet A's governor, knowing
    a fleet-B token's jti, recorded it first with an expiry already past; fleet B's own
    revocation then answered fleet A's record (created=false) and the token kept working.
    Fleet A's revocation of it also refused it in fleet B. Now each is its fleet's."""
    token_b = make_token("agent-b", "fleet-b")
    claims = inspect_token(token_b)["claims"]
    jti, expires = claims["jti"], datetime.fromtimestamp(claims["exp"], UTC)
    governor.revoke_token(jti, datetime.fromtimestamp(time.time() - 60, UTC), reason="x")
    governor.revoke_token(jti, expires, reason="fleet a has no say over fleet b's tokens")
    time.sleep(BOUND)
    for service in SERVICES:
        assert stack.probe(service, token_b) == OK, service  # fleet A's revocation: not B's
    with GovernanceClient(stack.address("governance"),
                          make_token("ops-b", "fleet-b", ("governor",))) as governor_b:
        reply = governor_b.revoke_token(jti, expires, agent_id="agent-b", reason="compromised")
    assert reply.created and reply.revoked.fleet_id == "fleet-b"
    assert reply.revoked.revoked_by == "ops-b"
    for service in SERVICES:
        _until(service, stack, token_b, REVOKED)
    verified = governor.verify_chain()  # both revocations replay from the chain
    assert verified.ok and not verified.problems, verified.problems


def test_a_revocation_given_a_wrong_earlier_expiry_is_extended_by_the_right_one(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    """Found by a review (2026-11-29): a revocation recorded with an expiry already past (a
    seconds-for-milliseconds slip) answered every later one with itself (created=false), so
    the token was never refused. A revocation now lasts as long as the latest expiry given."""
    from google.protobuf.timestamp_pb2 import Timestamp

    token = make_token("agent-1", "fleet-a")
    claims = inspect_token(token)["claims"]
    assert governor.revoke_token(claims["jti"], datetime.fromtimestamp(1, UTC),
                                 reason="typo").created
    right = governor.revoke_token(claims["jti"], datetime.fromtimestamp(claims["exp"], UTC),
                                  reason="leaked")
    assert right.created and right.revoked.expire_time.seconds == claims["exp"]
    assert right.revoked.reason == "leaked"
    for service in SERVICES:
        _until(service, stack, token, REVOKED)
    assert not governor.revoke_token(claims["jti"], datetime.fromtimestamp(2, UTC)).created
    verified = governor.verify_chain()  # both entries replay, the later one standing
    assert verified.ok and not verified.problems, verified.problems
    length = verified.checkpoint.length
    for seconds in (-9_000_000_000_000_000, -62_450_956_800):  # outside 0001..9999
        with pytest.raises(EngramRpcError) as refused:
            governor.call(governor.stub.RevokeToken, gpb.RevokeTokenRequest(
                jti="j-odd", expire_time=Timestamp(seconds=seconds)))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT  # was INTERNAL
        assert refused.value.reason == "INVALID_EXPIRE_TIME"
    assert governor.verify_chain().checkpoint.length == length


def test_a_stream_open_when_its_token_is_revoked_ends_there(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    """Found by review: a response stream was authorized once, at its start, so a download
    begun with a token revoked a moment later ran to its end. Now the stream's caller is
    authorized again each second while it runs (STREAM_RECHECK_SECONDS)."""
    token = make_token("agent-1", "fleet-a")
    size = 16 * 1024 * 1024  # far more than gRPC's flow-control windows hold
    with ArtifactsClient(stack.address("artifacts"), token) as agent:
        agent.start_run("run-s")
        stored = agent.upload((b"x" * (1 << 20) for _ in range(size >> 20)), run_id="run-s",
                              step_id="s", name="big.bin")
        _meta, chunks = agent.read(stored.artifact_id)
        received = len(next(chunks))
        claims = inspect_token(token)["claims"]
        governor.revoke_token(claims["jti"], datetime.fromtimestamp(claims["exp"], UTC))
        time.sleep(BOUND + 1.0)  # the restrictions refreshed, and a recheck is due
        with pytest.raises(EngramRpcError) as ended:
            for chunk in chunks:
                received += len(chunk)
        assert (ended.value.code, ended.value.reason) == REVOKED
        assert received < size


def test_an_upload_under_way_when_its_token_is_revoked_ends_there_and_stores_nothing(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    """Found by review: a client-streamed upload was authorized once, at its start, so an
    upload begun with a token revoked a moment later was stored. Now its caller is
    authorized again each second while its chunks come (STREAM_RECHECK_SECONDS)."""
    token, other = make_token("agent-1", "fleet-a"), make_token("agent-1", "fleet-a")
    claims = inspect_token(token)["claims"]

    def chunks() -> Iterator[bytes]:
        yield b"x" * (1 << 20)
        governor.revoke_token(claims["jti"], datetime.fromtimestamp(claims["exp"], UTC))
        time.sleep(BOUND + 1.0)  # the restrictions refreshed, and a recheck is due
        for _ in range(3):
            yield b"y" * (1 << 20)

    with ArtifactsClient(stack.address("artifacts"), token) as agent:
        agent.start_run("run-u")
        with pytest.raises(EngramRpcError) as ended:
            agent.upload(chunks(), run_id="run-u", step_id="s", name="late.bin")
    assert (ended.value.code, ended.value.reason) == REVOKED
    with ArtifactsClient(stack.address("artifacts"), other) as agent:
        assert not list(agent.list_artifacts("run-u"))


def test_a_stalled_upload_of_a_suspended_agent_ends_within_the_bound(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    """Found by a review (2026-11-29): an upload that stopped sending was authorized again
    only when its next chunk came, so a suspended agent's stalled uploads held their places
    for good. Its caller is now authorized again each second also while it sends nothing."""
    import threading

    token = make_token("agent-s", "fleet-a")
    release = threading.Event()

    def requests() -> Iterator[apb.CreateArtifactRequest]:
        yield apb.CreateArtifactRequest(header=apb.ArtifactHeader(run_id="run-s", step_id="s",
                                                                  name="stalled.bin"))
        yield apb.CreateArtifactRequest(chunk=b"x" * 1024)
        release.wait(60)

    with ArtifactsClient(stack.address("artifacts"), token) as agent:
        agent.start_run("run-s")
        call = agent.stub.CreateArtifact.future(requests(), metadata=agent.metadata, timeout=60)
        try:
            with pytest.raises(grpc.FutureTimeoutError):
                call.result(timeout=0.5)  # admitted and waiting for more
            governor.set_tier("agent-s", "suspended", reason="stalling uploads")
            began = time.monotonic()
            with pytest.raises(grpc.RpcError) as ended:
                call.result(timeout=BOUND + 5)
            assert time.monotonic() - began <= BOUND + 2
            failure = EngramRpcError.from_rpc_error(ended.value)
            assert (failure.code, failure.reason) == SUSPENDED
        finally:
            release.set()
            call.cancel()


def test_revoking_an_agent_refuses_its_older_tokens_everywhere(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    token = make_token("agent-1", "fleet-a")
    bystander = make_token("agent-2", "fleet-a")
    for service in SERVICES:
        assert stack.probe(service, token) == OK, service
    revoked = governor.revoke_agent_tokens("agent-1", reason="compromised host")
    assert revoked.issued_before.seconds >= inspect_token(token)["claims"]["iat"]
    for service in SERVICES:
        _until(service, stack, token, REVOKED)
        assert stack.probe(service, bystander) == OK
    time.sleep(1.05)  # tokens issued in the second of the revocation are refused too
    fresh = make_token("agent-1", "fleet-a")
    for service in SERVICES:
        assert stack.probe(service, fresh) == OK, "a token minted after the revocation works"


def test_a_suspended_agent_is_refused_by_every_rpc_but_reading_its_own_tier(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    token = make_token("mallory", "fleet-a")
    other = make_token("honest", "fleet-a")
    call = stack.call
    created = stack.stub("shard").CreateRecord(
        spb.CreateRecordRequest(record=spb.RecordInput(content="payments run nightly",
                                                       run_id="run-1")),
        metadata=[("authorization", f"Bearer {token}")])
    record_id = created.record.id
    assert call("artifacts", "StartRun", apb.StartRunRequest(run_id="run-1"), token) == OK
    artifact = stack.stub("artifacts").CreateArtifact(iter([
        apb.CreateArtifactRequest(header=apb.ArtifactHeader(run_id="run-1", step_id="s1",
                                                            name="a.txt")),
        apb.CreateArtifactRequest(chunk=b"hello"),
        apb.CreateArtifactRequest(trailer=apb.ArtifactTrailer(size_bytes=5))]),
        metadata=[("authorization", f"Bearer {token}")]).artifact
    iteration = cpb.IterationInput(iteration=1, status="ok", detail_json="{}")
    assert call("compactor", "RecordIteration",
                cpb.RecordIterationRequest(run_id="run-1", iteration=iteration), token) == OK

    calls = {
        ("shard", "GetRecord"): spb.GetRecordRequest(id=record_id),
        ("shard", "ListRecords"): spb.ListRecordsRequest(),
        ("shard", "SnapshotForRun"): spb.SnapshotForRunRequest(run_id="run-1"),
        ("shard", "GetStatus"): spb.GetStatusRequest(),
        ("shard", "CreateRecord"): spb.CreateRecordRequest(
            record=spb.RecordInput(content="more")),
        ("artifacts", "ReadArtifact"): apb.ReadArtifactRequest(artifact_id=artifact.artifact_id),
        ("artifacts", "AppendEvent"): apb.AppendEventRequest(run_id="run-1", type="step",
                                                             payload_json="{}"),
        ("artifacts", "StartRun"): apb.StartRunRequest(run_id="run-2"),
        ("compactor", "ReconstructIteration"): cpb.ReconstructIterationRequest(
            run_id="run-1", iteration=1),
        ("compactor", "RecordIteration"): cpb.RecordIterationRequest(
            run_id="run-1", iteration=cpb.IterationInput(iteration=2, status="ok",
                                                         detail_json="{}")),
        ("governance", "ListRules"): gpb.ListRulesRequest(),
        ("governance", "ListDecisions"): gpb.ListDecisionsRequest(),
    }
    for (service, method), request in calls.items():
        if method not in ("CreateRecord", "StartRun", "RecordIteration", "AppendEvent"):
            assert call(service, method, request, token) == OK, (service, method)

    governor.set_tier("mallory", "suspended", reason="poisoning")
    _until("shard", stack, token, SUSPENDED)
    time.sleep(BOUND)  # every service has refreshed by now
    for (service, method), request in calls.items():
        assert call(service, method, request, token) == SUSPENDED, (service, method)
    upload = stack.stub("artifacts").CreateArtifact
    with pytest.raises(grpc.RpcError) as refused:
        upload(iter([apb.CreateArtifactRequest(header=apb.ArtifactHeader(
            run_id="run-1", step_id="s2", name="b.txt"))]),
            metadata=[("authorization", f"Bearer {token}")])
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # It may still read its own tier, and only its own.
    own = stack.stub("governance").GetTrust(gpb.GetTrustRequest(),
                                            metadata=[("authorization", f"Bearer {token}")])
    assert own.trust.tier == gpb.TRUST_TIER_SUSPENDED
    assert call("governance", "GetTrust", gpb.GetTrustRequest(agent_id="honest"),
                token)[0] == grpc.StatusCode.PERMISSION_DENIED
    for service in SERVICES:
        assert stack.probe(service, other) == OK, "another agent is not affected"

    governor.set_tier("mallory", "standard", reason="cleared")
    _until("compactor", stack, token, OK)


def test_restrictions_stay_in_force_while_governance_is_down(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory) -> None:
    token = make_token("agent-1", "fleet-a")
    governor.revoke_agent_tokens("agent-1")
    for service in ("shard", "artifacts", "compactor"):
        _until(service, stack, token, REVOKED)
    stack.servers["governance"].stop(0)
    time.sleep(BOUND)
    for service in ("shard", "artifacts", "compactor"):
        assert stack.probe(service, token) == REVOKED, service


def test_only_governors_revoke_and_only_services_list(stack: Stack,
                                                      make_token: TokenFactory) -> None:
    agent = make_token("agent-1", "fleet-a")
    service = make_token("svc-shard", "system", ("service",))
    far = gpb.RevokeTokenRequest(jti="j1")
    far.expire_time.FromSeconds(int(time.time()) + 60)
    for request, method in ((far, "RevokeToken"),
                            (gpb.RevokeAgentTokensRequest(agent_id="agent-2"),
                             "RevokeAgentTokens")):
        for token in (agent, service):
            assert stack.call("governance", method, request, token) == (
                grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED"), (method, token == agent)
    for token in (agent, make_token("ops", "fleet-a", ("governor",))):
        assert stack.call("governance", "ListAccessRestrictions",
                          gpb.ListAccessRestrictionsRequest(), token) == (
            grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")
    with GovernanceClient(stack.address("governance"), service) as client:
        listed = client.access_restrictions(0)
        assert listed.changed and listed.version >= 1
        assert not client.access_restrictions(listed.version).changed
    with GovernanceClient(stack.address("governance"),
                          make_token("ops", "fleet-a", ("governor",))) as gov, \
            pytest.raises(EngramRpcError) as bad:
        gov.revoke_token("j1", datetime(2999, 1, 1, tzinfo=UTC))
    assert bad.value.reason == "INVALID_EXPIRE_TIME"


def test_revocations_are_in_the_witness_chain(stack: Stack, governor: GovernanceClient,
                                              make_token: TokenFactory) -> None:
    before = governor.checkpoint().length
    claims = inspect_token(make_token("agent-1", "fleet-a"))["claims"]
    governor.revoke_token(claims["jti"], datetime.fromtimestamp(claims["exp"], UTC))
    governor.revoke_agent_tokens("agent-3")
    assert governor.checkpoint().length == before + 2
    assert governor.verify_chain().ok


def test_a_revocation_deleted_behind_governances_back_is_found(
        stack: Stack, governor: GovernanceClient, make_token: TokenFactory,
        tmp_path: Path) -> None:
    claims = inspect_token(make_token("agent-1", "fleet-a"))["claims"]
    governor.revoke_token(claims["jti"], datetime.fromtimestamp(claims["exp"], UTC))
    governor.revoke_agent_tokens("agent-3")
    assert governor.verify_chain().ok
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'governance.db'}")
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("DELETE FROM revoked_tokens"))
        conn.execute(sqlalchemy.text("UPDATE revoked_agents SET revoked_ms = 0"))
    engine.dispose()
    report = governor.verify_chain()
    assert not report.ok
    assert any(f"token fleet-a/{claims['jti']}" in p and "missing from the store" in p
               for p in report.problems), report.problems
    assert any("agent fleet-a/agent-3" in p and "differs" in p for p in report.problems)
