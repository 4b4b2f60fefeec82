"""Reads of a run whose event log is being appended to. SQLite and Postgres.

A replay reads the run (its event count and head), then its events in batches: events appended
after the run was read are not a broken chain. Before, a replay of a live run ended in
DATA_LOSS EVENT_CHAIN_BROKEN ("the log ends at N+k but the run records N events")."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session

from engram.client import EngramRpcError
from services.artifacts.domain.entities import Run
from services.artifacts.tables import ArtifactRow, EventRow, RunRow, RunTombstoneRow
from services.common.errors import NotFound
from tests.integration.artifacts.conftest import RunningArtifacts

APPENDS = 200


def test_a_replay_of_a_run_being_appended_to_is_a_whole_verified_prefix(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    writer, reader = env.client, env.client
    run_id = writer.start_run().run.run_id
    for i in range(10):
        writer.append_event(run_id, "step", {"i": i})
    done = threading.Event()
    errors: list[BaseException] = []

    def append() -> None:
        try:
            for i in range(10, 10 + APPENDS):
                writer.append_event(run_id, "step", {"i": i})
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=append)
    thread.start()
    broken: list[str] = []
    lengths: list[int] = []
    while not done.is_set():
        try:
            seqs = [event.seq for event in reader.replay(run_id)]
        except EngramRpcError as error:
            broken.append(f"{error.code.name} {error.reason}: {error.message}")
            continue
        assert seqs == list(range(1, len(seqs) + 1))
        lengths.append(len(seqs))
    thread.join(timeout=60)
    assert not errors
    assert len(lengths) + len(broken) > 5  # the replays overlapped the appends
    assert not broken, f"{len(broken)} replays failed: {broken[:3]}"
    assert min(lengths) >= 10
    assert len(list(reader.replay(run_id))) == 10 + APPENDS


def test_an_event_inserted_beyond_the_runs_count_still_breaks_replay(
        artifacts_server: RunningArtifacts) -> None:
    """A replay stops at the run's recorded count (later appends are the next replay's), so an
    event row written into the store without the run's head moving must still be found."""
    env = artifacts_server
    run_id = env.client.start_run().run.run_id
    last = [env.client.append_event(run_id, "step", {"i": i}).event for i in range(3)][-1]
    with env.service.db.session() as session:
        session.add(EventRow(fleet_id="fleet-a", run_id=run_id, seq=4, type="step",
                             payload_json='{"i":99}', manifest_id="", artifact_ids_json="[]",
                             created_us=1, agent_id="agent-1",
                             prev_hash=last.hash, hash="0" * 64))
    with pytest.raises(EngramRpcError) as caught:
        list(env.client.replay(run_id))
    assert caught.value.code == grpc.StatusCode.DATA_LOSS
    assert caught.value.reason == "EVENT_CHAIN_BROKEN" and "beyond" in caught.value.message


def _erased_when_opened(env: RunningArtifacts, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The blob store's open() runs after an erasure committed: the row and the file are gone
    (as ForgetRuns leaves them) when the read that listed the artifact opens its file."""
    opened: list[str] = []

    def erased(path: str, *_args: object) -> object:
        opened.append(path)
        with env.service.db.session() as session:
            session.execute(delete(ArtifactRow).where(ArtifactRow.path == path))
        raise NotFound(f"blob {path!r} not found", reason="BLOB_NOT_FOUND")

    monkeypatch.setattr(env.service.blobs, "open", erased)
    return opened


def test_an_artifact_erased_while_it_is_read_or_verified_is_gone_not_lost(
        artifacts_server: RunningArtifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, VerifyArtifacts during a ForgetRuns reported BLOB_MISSING (and counted an
    integrity failure) for an artifact erased after its row was read, and ReadArtifact
    answered DATA_LOSS instead of NOT_FOUND."""
    env = artifacts_server
    client = env.client
    run_id = client.start_run().run.run_id
    kept = client.upload([b"kept bytes"], run_id=run_id, step_id="s", name="kept.txt")
    erased = client.upload([b"erased bytes"], run_id=run_id, step_id="s", name="erased.txt")
    opened = _erased_when_opened(env, monkeypatch)
    with pytest.raises(EngramRpcError) as caught:
        _, chunks = client.read(erased.artifact_id)
        b"".join(chunks)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND, caught.value
    monkeypatch.undo()
    opened = _erased_when_opened(env, monkeypatch)
    report = client.verify(run_id)
    assert opened == [kept.path] and list(report.problems) == []


def test_a_run_erased_while_it_is_started_again_stays_erased(
        artifacts_server: RunningArtifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """StartRun checked the tombstone, then inserted the run: an erasure committing between the
    two let the run be created again under the erased id (and every later erasure of it
    counted as already done). The check now follows the insert in its transaction."""
    env = artifacts_server
    repository = env.service.repository
    add_run = repository.add_run

    def erased_meanwhile(session: Session, run: Run) -> None:
        with env.service.db.session() as other:  # the erasure, committed first
            other.add(RunTombstoneRow(
                fleet_id=run.fleet_id, run_id=run.run_id, agent_id=run.agent_id,
                created_us=1, event_count=0, head_hash="", erasure_id="er_" + "0" * 32,
                erased_us=2, erased_by="op", blobs_left_json="[]"))
        add_run(session, run)

    monkeypatch.setattr(repository, "add_run", erased_meanwhile)
    with pytest.raises(EngramRpcError) as caught:
        env.client.start_run("run-resumed")
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.reason == "RUN_ERASED"
    monkeypatch.undo()
    with pytest.raises(EngramRpcError) as gone:
        env.client.get_run("run-resumed")
    assert gone.value.reason == "RUN_ERASED"


def test_a_run_erased_during_its_replay_is_not_found_not_data_loss(
        artifacts_server: RunningArtifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay reads the run, then its events in batches; a ForgetRuns committing in between
    leaves fewer events than the run had: that is an erased run (NOT_FOUND RUN_ERASED), not a
    truncated log (it was DATA_LOSS EVENT_CHAIN_BROKEN)."""
    env = artifacts_server
    run_id = env.client.start_run().run.run_id
    for i in range(3):
        env.client.append_event(run_id, "step", {"i": i})
    events_after = env.service.repository.events_after

    def erased_first(session: Session, fleet_id: str, run: str, after: int,
                     limit: int) -> list[Any]:
        with env.service.db.session() as other:  # the erasure, committed first
            for table in (EventRow, RunRow):
                other.execute(delete(table).where(table.run_id == run))
            other.add(RunTombstoneRow(
                fleet_id=fleet_id, run_id=run, agent_id="agent-1", created_us=1,
                event_count=3, head_hash="h", erasure_id="er_" + "1" * 32, erased_us=2,
                erased_by="op", blobs_left_json="[]"))
        return events_after(session, fleet_id, run, after, limit)

    monkeypatch.setattr(env.service.repository, "events_after", erased_first)
    with pytest.raises(EngramRpcError) as caught:
        list(env.client.replay(run_id))
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.NOT_FOUND, "RUN_ERASED")
