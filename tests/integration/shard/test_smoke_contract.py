"""End-to-end contract of the shard service over real gRPC, on SQLite and Postgres."""

from __future__ import annotations

import grpc
import pytest

from engram.client import EngramRpcError, ShardClient, record_input
from tests.integration.shard.conftest import ClientFactory


def test_write_is_content_addressed_and_idempotent(client: ShardClient) -> None:
    first = client.add(
        "Lesson learned: retries need idempotency keys",
        importance=0.8,
        tags=["ops"],
        run_id="run-1",
    )
    again = client.add(
        "Lesson learned: retries need idempotency keys",
        importance=0.8,
        tags=["ops"],
        run_id="run-1",
    )
    assert first.created and not again.created
    assert first.record.id == again.record.id
    assert first.record.domain == "insights"
    assert first.record.agent_id == "agent-1"
    assert len(first.record.content_hash) == 64
    assert client.get(first.record.id).content == first.record.content


def test_author_is_the_caller_and_fleets_are_isolated(client_for: ClientFactory) -> None:
    alice = client_for("alice", "fleet-a")
    mallory = client_for("mallory", "fleet-b")
    written = alice.add("project goal: ship the shard service").record
    assert written.agent_id == "alice"
    with pytest.raises(EngramRpcError) as caught:
        mallory.get(written.id)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert mallory.search("shard service") == []
    assert [h.record.id for h in alice.search("shard service")] == [written.id]


def test_batch_is_all_or_nothing(client: ShardClient) -> None:
    good = record_input("task: write the README tour")
    bad = record_input("x", importance=2.0)
    with pytest.raises(EngramRpcError) as caught:
        client.add_many([good, bad])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "IMPORTANCE_OUT_OF_RANGE"
    assert "record 1" in caught.value.message
    assert list(client.list()) == []


def test_unauthenticated_call_is_refused(client: ShardClient) -> None:
    stub_call = client.stub.GetStatus
    from engram.shard.v1 import shard_service_pb2 as pb

    with pytest.raises(grpc.RpcError) as caught:
        stub_call(pb.GetStatusRequest())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
