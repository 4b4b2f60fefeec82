"""A record edited behind the service's back is reported by verify and snapshot, never served."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import text

from engram.client import EngramRpcError, ShardClient
from services.shard.service import ShardService


def _tamper(service: ShardService, record_id: str, column: str, value: object) -> None:
    with service.db.engine.begin() as conn:
        conn.execute(
            text(f"UPDATE records SET {column} = :v WHERE id = :id"), {"v": value, "id": record_id}
        )


def test_snapshot_streams_exactly_one_run(client: ShardClient) -> None:
    a = client.add("task: run A first note", run_id="run-a").record
    b = client.add("task: run A second note", run_id="run-a").record
    client.add("task: run B note", run_id="run-b")
    legacy = client.add("task: legacy note").record
    assert [r.id for r in client.snapshot("run-a")] == [a.id, b.id]
    assert [r.id for r in client.snapshot("")] == [legacy.id]
    assert list(client.snapshot("run-none")) == []


@pytest.mark.parametrize(
    ("column", "value"),
    [("content", "task: edited"), ("importance", 0.99), ("agent_id", "mallory")],
)
def test_tampering_is_data_loss(
    client: ShardClient, shard: tuple[str, ShardService], column: str, value: object
) -> None:
    good = client.add("task: keep me intact", run_id="run-t").record
    bad = client.add("task: someone edits me", run_id="run-t").record
    _tamper(shard[1], bad.id, column, value)

    report = client.verify(all_records=True)
    assert report.checked == 2
    assert [f.id for f in report.failures] == [bad.id]
    assert bad.id in report.failures[0].detail

    assert not client.verify([good.id]).failures
    with pytest.raises(EngramRpcError) as caught:
        list(client.snapshot("run-t"))
    assert caught.value.code == grpc.StatusCode.DATA_LOSS
    assert bad.id in caught.value.message
    assert caught.value.metadata["record_id"] == bad.id
    # without verification the stream is served (explicitly unverified)
    assert len(list(client.snapshot("run-t", verify=False))) == 2


def test_verify_needs_a_target(client: ShardClient) -> None:
    with pytest.raises(EngramRpcError) as caught:
        client.verify()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(EngramRpcError) as caught:
        client.verify(["0" * 32])
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
