"""Format-2 events and snapshots over real gRPC, on SQLite and Postgres (docs/erasure.md): each
gets a salt, an event's chain hash covers its payload's commitment and a snapshot's state_hash
is its state's commitment; a byte changed in a stored payload, state, salt or commitment is
DATA_LOSS on replay, read and rehydrate, and a snapshot's is listed by VerifyArtifacts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from sqlalchemy import delete, select, update

from engram.client._errors import EngramRpcError
from services.artifacts.domain.chain import event_hash_v2
from services.artifacts.tables import EventRow, SnapshotRow
from services.common.commitment import commitment
from tests.integration.artifacts.conftest import RunningArtifacts


def _flipped(value: str) -> str:
    """``value`` with one character changed (hex stays hex)."""
    at = len(value) // 2
    return value[:at] + ("0" if value[at] != "0" else "1") + value[at + 1:]


def test_new_events_chain_commitments_and_snapshots_hash_to_theirs(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    client = env.client
    run_id = client.start_run("run-1").run.run_id
    events = [client.append_event(run_id, "tool.called", {"q": f"secret {i}"}).event
              for i in range(3)]
    for event in events:
        assert event.format == 2 and len(event.salt) == 64
        assert event.payload_commitment == commitment(event.salt, event.payload_json.encode())
        assert event.hash == event_hash_v2(
            prev_hash=event.prev_hash, run_id=run_id, seq=event.seq, type=event.type,
            payload_commitment=event.payload_commitment, manifest_id="", artifact_ids=(),
            agent_id="agent-1", created_us=event.create_time.ToMicroseconds())
    assert len({e.salt for e in events}) == 3
    assert list(client.replay(run_id)) == events
    assert list(client.list_events(run_id)) == events
    state = {"seen": "secret"}
    snapshot = client.create_snapshot(run_id, state)
    text = json.dumps(state, separators=(",", ":"), sort_keys=True)
    assert snapshot.state_json == text and snapshot.format == 2 and len(snapshot.salt) == 64
    assert snapshot.state_hash == commitment(snapshot.salt, text.encode())
    assert snapshot.state_hash != hashlib.sha256(text.encode()).hexdigest()
    assert client.latest_snapshot(run_id) == snapshot
    assert client.rehydrate(run_id).snapshot == snapshot
    report = client.verify(run_id)
    assert not report.snapshot_problems
    stopped = client.stop_run(run_id, "succeeded", "done")  # the service's own event too
    assert stopped.event_count == 4
    (stop,) = client.list_events(run_id, after_seq=3)
    assert stop.format == 2 and stop.hash == stopped.head_hash
    assert [e.hash for e in client.replay(run_id)][-1] == stopped.head_hash


@pytest.mark.parametrize(("column", "value"), [
    ("payload_json", lambda v: v.replace("secret", "secreT")),
    ("salt", _flipped),
    ("salt", lambda v: "zz" + v[2:]),  # no longer hex
    ("payload_commitment", _flipped),
    ("format", lambda v: 1),
], ids=["payload", "salt", "salt-not-hex", "commitment", "format"])
def test_a_changed_byte_in_a_stored_event_breaks_replay(
        artifacts_server: RunningArtifacts, column: str, value: Callable[[Any], object]) -> None:
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    for i in range(3):
        env.client.append_event(run_id, "step", {"said": f"secret {i}"})
    with env.service.db.session() as session:
        where = (EventRow.run_id == run_id, EventRow.seq == 2)
        stored = session.scalar(select(getattr(EventRow, column)).where(*where))
        session.execute(update(EventRow).where(*where).values(
            {column: value(stored)}))
    with pytest.raises(EngramRpcError) as caught:
        list(env.client.replay(run_id))
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.DATA_LOSS,
                                                        "EVENT_CHAIN_BROKEN")
    assert caught.value.metadata.get("seq") == "2"


@pytest.mark.parametrize(("column", "value"), [
    ("state_json", lambda v: v.replace("secret", "secreT")),
    ("salt", _flipped),
    ("salt", lambda v: "zz" + v[2:]),
    ("state_hash", _flipped),
    ("format", lambda v: 1),
], ids=["state", "salt", "salt-not-hex", "state-hash", "format"])
def test_a_changed_byte_in_a_stored_snapshot_is_found_on_read_and_verify(
        artifacts_server: RunningArtifacts, column: str, value: Callable[[Any], object]) -> None:
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    env.client.append_event(run_id, "step", {"i": 1})
    kept = env.client.create_snapshot(run_id, {"seen": "kept"})
    altered = env.client.create_snapshot(run_id, {"seen": "secret"})
    with env.service.db.session() as session:
        where = (SnapshotRow.snapshot_id == altered.snapshot_id,)
        stored = session.scalar(select(getattr(SnapshotRow, column)).where(*where))
        session.execute(update(SnapshotRow).where(*where).values(
            {column: value(stored)}))
    for read in (env.client.latest_snapshot, env.client.rehydrate):
        with pytest.raises(EngramRpcError) as caught:
            read(run_id)
        assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.DATA_LOSS,
                                                            "SNAPSHOT_HASH_MISMATCH")
    report = env.client.verify(run_id)
    assert report.snapshots_checked == 2
    assert [(p.snapshot_id, p.problem) for p in report.snapshot_problems] == [
        (altered.snapshot_id, "SNAPSHOT_HASH_MISMATCH")]
    assert kept.snapshot_id != altered.snapshot_id


@pytest.mark.parametrize(("column", "value"), [
    ("payload_json", lambda v: v.replace("secret", "secreT")),
    ("salt", _flipped),
    ("payload_commitment", _flipped),
], ids=["payload", "salt", "commitment"])
def test_rehydrate_re_hashes_the_events_it_returns(
        artifacts_server: RunningArtifacts, column: str, value: Callable[[Any], object]) -> None:
    """The events after the latest snapshot are checked as replay checks them, and must end at
    the run's head: an altered one is DATA_LOSS, not handed back as the run's state."""
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    env.client.append_event(run_id, "step", {"said": "before"})
    env.client.create_snapshot(run_id, {"upto": 1})
    for i in range(3):
        env.client.append_event(run_id, "step", {"said": f"secret {i}"})
    assert [e.seq for e in env.client.rehydrate(run_id).events] == [2, 3, 4]
    assert [e.seq for e in env.client.rehydrate(run_id, max_events=2).events] == [2, 3]
    with env.service.db.session() as session:
        where = (EventRow.run_id == run_id, EventRow.seq == 3)
        stored = session.scalar(select(getattr(EventRow, column)).where(*where))
        session.execute(update(EventRow).where(*where).values({column: value(stored)}))
    for max_events in (0, 2):
        with pytest.raises(EngramRpcError) as caught:
            env.client.rehydrate(run_id, max_events=max_events)
        assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.DATA_LOSS,
                                                            "EVENT_CHAIN_BROKEN")


def test_rehydrate_finds_the_last_events_removed(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    for i in range(3):
        env.client.append_event(run_id, "step", {"i": i})
    with env.service.db.session() as session:
        session.execute(delete(EventRow).where(EventRow.run_id == run_id, EventRow.seq >= 2))
    with pytest.raises(EngramRpcError) as caught:
        env.client.rehydrate(run_id)
    assert caught.value.reason == "EVENT_CHAIN_BROKEN"
