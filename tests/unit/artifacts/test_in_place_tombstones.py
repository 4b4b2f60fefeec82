"""Events and snapshots erased in place (docs/erasure.md, issue 17): a format-2 tombstone keeps
its link (the hash recomputes from the kept commitment) and is counted, not failed; a tombstone
that still holds its payload or salt, a format-1 one, or one whose kept fields were altered is
a broken chain; a snapshot tombstone keeps its state_hash and re-hashes to no problem unless
malformed. Carrying out an erasure is one transaction: a failure before the commit (a crash)
leaves every item as it was, and a rerun erases nothing more."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from services.artifacts.domain.chain import ChainVerifier, event_intact, next_event
from services.artifacts.domain.entities import Event, EventDraft, Run, RunStatus
from services.artifacts.erasure import RunEraser
from services.artifacts.server import MIGRATIONS
from services.artifacts.service import ArtifactsService
from services.artifacts.tables import SnapshotRow
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.common.erasure_source import ErasureOrder
from services.common.errors import IntegrityError


def _chain(count: int) -> list[Event]:
    events: list[Event] = []
    for n in range(1, count + 1):
        head = events[-1].hash if events else ""
        run = Run(run_id="r", fleet_id="f", agent_id="a", status=RunStatus.RUNNING,
                  stop_reason="", created_us=1, stopped_us=0, event_count=len(events),
                  head_hash=head, latest_snapshot_id="", metadata_json="{}")
        events.append(next_event(run, EventDraft("said", f'{{"n":{n}}}', agent_id="a"), n))
    return events


def _erased(event: Event) -> Event:
    return replace(event, payload_json="", salt="", erasure_id="era_" + "1" * 28,
                   erased_us=5, erased_by="op")


def test_a_tombstone_keeps_its_link_and_is_counted() -> None:
    events = _chain(3)
    events[1] = _erased(events[1])
    verifier = ChainVerifier("r")
    assert verifier.check_all(events) == events[2].hash
    assert (verifier.length, verifier.tombstoned) == (3, 1)


@pytest.mark.parametrize("change", [
    {"payload_json": '{"n":2}'},  # content left in a tombstone
    {"salt": "ab" * 32},  # its salt left
    {"payload_commitment": "00" * 32},  # the kept commitment altered
    {"payload_commitment": ""},  # no commitment kept
    {"type": "altered"},  # a kept structural field altered
    {"format": 1},  # a format-1 event is never a tombstone
    {"erasure_id": "x"},  # names no erasure id governance issues (blanked in the database)
    {"erasure_id": "era_" + "A" * 28},  # not lowercase hex
    {"erasure_id": "era_" + "1" * 27},  # too short
    {"erased_us": 0},  # no erase time
])
def test_a_malformed_or_altered_tombstone_breaks_the_chain(change: dict[str, Any]) -> None:
    events = _chain(2)
    bad = replace(_erased(events[0]), **change)
    assert not event_intact(bad, "")
    with pytest.raises(IntegrityError) as broken:
        ChainVerifier("r").check_all([bad, events[1]])
    assert broken.value.reason == "EVENT_CHAIN_BROKEN"


def _snapshot_row(**fields: Any) -> SnapshotRow:
    values: dict[str, Any] = dict(snapshot_id="snap_1", fleet_id="f", run_id="r", seq=1,
                                  state_json="", state_hash="ab" * 32, manifest_id="",
                                  artifact_ids_json="[]", created_us=1, format=2, salt="",
                                  erasure_id="era_" + "1" * 28, erased_us=5, erased_by="op")
    values.update(fields)
    return SnapshotRow(**values)


def test_a_snapshot_tombstone_reads_without_state_and_verifies() -> None:
    row = _snapshot_row()
    assert row.problem() is None
    read = row.to_entity()
    assert (read.state_json, read.salt, read.erased, read.state_hash) == (
        "", "", True, "ab" * 32)


@pytest.mark.parametrize("change", [{"state_json": '{"s":1}'}, {"salt": "ab" * 32},
                                    {"format": 1}, {"state_hash": "xyz"},
                                    {"erasure_id": "x"}, {"erasure_id": "era_" + "g" * 28},
                                    {"erased_us": 0}])
def test_a_malformed_snapshot_tombstone_is_a_problem(change: dict[str, Any]) -> None:
    problem = _snapshot_row(**change).problem()
    assert problem is not None and problem.problem == "SNAPSHOT_HASH_MISMATCH"
    with pytest.raises(IntegrityError):
        _snapshot_row(**change).to_entity()


@pytest.fixture
def service(tmp_path: Path) -> Any:
    database = Database(f"sqlite:///{tmp_path / 'a.db'}")
    database.upgrade(MIGRATIONS)
    yield ArtifactsService(database, FileBlobStore(tmp_path / "blobs"))
    database.engine.dispose()


def test_a_crash_before_the_commit_erases_nothing_and_a_rerun_finishes(
        service: ArtifactsService, monkeypatch: pytest.MonkeyPatch) -> None:
    service.start_run("f", "a", "r")
    first, _ = service.append_event("f", "a", "r", "said", '{"n":1}')
    second, _ = service.append_event("f", "a", "r", "said", '{"n":2}')
    snapshot, _ = service.create_snapshot("f", "r", '{"s":1}')
    order = ErasureOrder("era_" + "2" * 28, "f", "op", (
        ("event", "r:1", first.hash), ("event", "r:2", second.hash),
        ("snapshot", snapshot.snapshot_id, snapshot.state_hash)))

    class Source:
        def erasure(self, erasure_id: str) -> ErasureOrder:
            return order

    eraser = RunEraser(service, Source())
    with monkeypatch.context() as patch:
        def crash(*args: object) -> None:
            raise RuntimeError("power lost")

        patch.setattr(service.db, "vacuum", crash)  # after the commit: the rows are erased
        with pytest.raises(RuntimeError):
            eraser.erase("f", order.erasure_id, 7)
    assert [e.erased for e in service.replay("f", "r")] == [True, True]
    service.db.vacuum(())

    # a crash inside the transaction (its flush) leaves everything as it was
    service.start_run("f", "a", "r2")
    kept, _ = service.append_event("f", "a", "r2", "said", '{"n":3}')
    order = ErasureOrder("era_" + "3" * 28, "f", "op", (("event", "r2:1", kept.hash),))
    flush = Session.flush

    def failing_flush(self: Session, *args: Any, **kwargs: Any) -> None:
        if any(getattr(o, "erasure_id", "") for o in self.dirty):
            raise RuntimeError("crash mid-transaction")
        flush(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Session, "flush", failing_flush)
        with pytest.raises(RuntimeError):
            eraser.erase("f", order.erasure_id, 8)
    assert [(e.erased, e.payload_json) for e in service.replay("f", "r2")] == [
        (False, '{"n":3}')]
    erased, already, in_place, _ = eraser.erase("f", order.erasure_id, 9)
    assert (erased, already, in_place.events, in_place.already) == ([], 0, 1, 0)
    again = eraser.erase("f", order.erasure_id, 10)[2]
    assert (again.events, again.snapshots, again.already) == (0, 0, 1)
    assert service.latest_snapshot("f", "r").erased
