"""Events and snapshots erased in place travel in bundles as tombstones (docs/bundle.md,
docs/erasure.md): the target takes one only when an erasure it holds lists it under its kept
hash, replays the run's chain through it and reads it without content; a bundle made before
the erasure brings the content back nowhere (imported after, it changes nothing; imported
before, the import's last step erases it). ImportRunItems refuses a tombstone without its
erasure, one its erasure does not list, and malformed tombstone fields, storing nothing."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.bundle import BundleReader
from engram.client import EngramRpcError, ShardClient
from engram.client.artifacts import ArtifactsClient
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.stack import full_stack

FLEET = "fleet-a"
SECRET = "zqxbundled-secret"


def _copy(event: apb.Event, **changes: object) -> apb.Event:
    copied = apb.Event()
    copied.CopyFrom(event)
    for name, value in changes.items():
        if name == "erase_us":
            copied.erase_time.FromMicroseconds(int(str(value)))
        elif name == "no_erase_time":
            copied.ClearField("erase_time")
        else:
            setattr(copied, name, value)
    return copied


def _refused(call: object, **kwargs: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(EngramRpcError) as refused:
        call(**kwargs)  # type: ignore[operator]
    return refused.value.code, refused.value.reason


def test_an_event_erased_in_place_travels_as_a_tombstone(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    before, after = tmp_path / "before.bundle", tmp_path / "after.bundle"
    with full_stack(tmp_path / "a", engram_home, make_token, governed=True) as origin:
        with ArtifactsClient(origin.artifacts.address, agent) as art:
            art.start_run("run-t", {})
            art.append_event("run-t", "tool.called", {"q": "plain"})
            art.append_event("run-t", "tool.called", {"q": SECRET})
            art.create_snapshot("run-t", {"seen": SECRET}, seq=2)
            art.append_event("run-t", "tool.result", {"ok": True})
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "-o", str(before))
            done = run("forget", "--match", SECRET)
            assert (done["events_erased"], done["snapshots_erased"]) == (1, 1)
            run("export", "--fleet", FLEET, "-o", str(after))
        erasure_id = done["erasures"][0]["erasure_id"]
        with ArtifactsClient(origin.artifacts.address, admin) as art:
            events = list(art.replay("run-t"))
            snapshot = art.latest_snapshot("run-t")
        with GovernanceClient(origin.governance.address, admin) as gov:
            erasure = gov.erasure(erasure_id)
    tombstone = events[1]
    assert tombstone.erasure_id == erasure_id and not tombstone.payload_json

    # the newer bundle, then the older: the tombstone stays
    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token, governed=True) as target, \
            cli_for(target, admin, monkeypatch) as run:
        loaded = run("import-bundle", str(after))
        assert loaded["not_imported"] == {}
        with ArtifactsClient(target.artifacts.address, admin) as art:
            assert list(art.replay("run-t")) == events
            assert art.latest_snapshot("run-t") == snapshot
            report = art.verify("run-t")
            assert report.snapshots_tombstoned == 1 and not report.snapshot_problems
        run("import-bundle", str(before))
        with ArtifactsClient(target.artifacts.address, admin) as art:
            assert list(art.replay("run-t")) == events  # nothing brought back
            assert art.latest_snapshot("run-t") == snapshot

    # the older bundle, then the newer: its last step erases the copy the older brought
    (tmp_path / "c").mkdir()
    with full_stack(tmp_path / "c", engram_home, make_token, governed=True) as target, \
            cli_for(target, admin, monkeypatch) as run:
        run("import-bundle", str(before))
        with ArtifactsClient(target.artifacts.address, admin) as art:
            assert SECRET in list(art.replay("run-t"))[1].payload_json
        run("import-bundle", str(after))
        with ArtifactsClient(target.artifacts.address, admin) as art:
            again = list(art.replay("run-t"))
            assert [e.hash for e in again] == [e.hash for e in events]
            assert not again[1].payload_json and again[1].erasure_id == erasure_id
            assert not art.latest_snapshot("run-t").state_json

    # ImportRunItems on a target with the run's first event only
    (tmp_path / "d").mkdir()
    with full_stack(tmp_path / "d", engram_home, make_token, governed=True) as target, \
            ArtifactsClient(target.artifacts.address, admin) as art:
        run_row = apb.Run(run_id="run-t", agent_id="scout-1",
                          status=apb.RUN_STATUS_RUNNING, metadata_json="{}")
        run_row.create_time.CopyFrom(events[0].create_time)
        art.import_run(run_row)
        art.import_run_items(events=[events[0]])
        assert _refused(art.import_run_items, events=[tombstone]) == (
            grpc.StatusCode.NOT_FOUND, "ERASURE_NOT_FOUND")  # no such erasure here
        with GovernanceClient(target.governance.address, admin) as gov:
            other = gov.record_erasure("run", "run-t", [gpb.ErasedItem(
                kind="event", id="run-t:3", leaf_hash=events[2].hash)]).erasure
        for bad, expected in (
                (_copy(tombstone, erasure_id=other.erasure_id),  # lists another event
                 (grpc.StatusCode.FAILED_PRECONDITION, "TOMBSTONE_NOT_IN_ERASURE")),
                (_copy(tombstone, payload_json='{"q":"back"}'),
                 (grpc.StatusCode.INVALID_ARGUMENT, "EVENT_HASH_MISMATCH")),
                (_copy(tombstone, salt="ab" * 32),
                 (grpc.StatusCode.INVALID_ARGUMENT, "EVENT_HASH_MISMATCH")),
                (_copy(tombstone, no_erase_time=True),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")),
                (_copy(tombstone, erasure_id="nope"),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")),
                (_copy(tombstone, erased_by="a b"),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER")),
                (_copy(events[0], erased_by="op"),  # fields of a tombstone, no erasure
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")),
                (_copy(events[0], erase_us=5),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE"))):
            assert _refused(art.import_run_items, events=[bad]) == expected, bad
        restored = apb.Snapshot()
        restored.CopyFrom(snapshot)
        restored.state_json = '{"seen":"back"}'
        assert _refused(art.import_run_items, snapshots=[restored]) == (
            grpc.StatusCode.INVALID_ARGUMENT, "SNAPSHOT_HASH_MISMATCH")
        salted = apb.Snapshot()
        salted.CopyFrom(snapshot)
        salted.salt = "ab" * 32
        assert _refused(art.import_run_items, snapshots=[salted]) == (
            grpc.StatusCode.INVALID_ARGUMENT, "SNAPSHOT_HASH_MISMATCH")
        undated = apb.Snapshot()
        undated.CopyFrom(snapshot)
        undated.ClearField("erase_time")
        assert _refused(art.import_run_items, snapshots=[undated]) == (
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")
        half = apb.Snapshot()
        half.CopyFrom(snapshot)
        half.erasure_id = ""  # erase_time and erased_by without an erasure
        assert _refused(art.import_run_items, snapshots=[half]) == (
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")
        assert _refused(art.import_run_items, snapshots=[snapshot]) == (
            grpc.StatusCode.NOT_FOUND, "ERASURE_NOT_FOUND")
        assert art.get_run("run-t").event_count == 1  # nothing stored
        assert not list(art.list_snapshots("run-t"))
        with GovernanceClient(target.governance.address, admin) as gov:
            gov.import_erasures([erasure])
        assert art.import_run_items(events=[tombstone], snapshots=[snapshot]).created == 2
        assert list(art.replay("run-t")) == events[:2]
        assert art.latest_snapshot("run-t") == snapshot


def test_a_run_bundle_carries_the_erasures_of_its_events_and_snapshots(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``engram export --run`` carries every erasure its events' and snapshots' tombstones name
    (here none of them names a record of the run), so the run imports whole; erasures of other
    runs stay out of it, and a fleet bundle carries them all (found by review: the run bundle
    carried only its records' erasures and failed to import, ERASURE_NOT_FOUND)."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    run_bundle, fleet_bundle = tmp_path / "run.bundle", tmp_path / "fleet.bundle"
    with full_stack(tmp_path / "a", engram_home, make_token, governed=True) as origin:
        with ArtifactsClient(origin.artifacts.address, agent) as art:
            art.start_run("run-t", {})
            art.append_event("run-t", "tool.called", {"q": "plain"})
            art.append_event("run-t", "tool.called", {"q": SECRET + "-event"})
            art.create_snapshot("run-t", {"seen": SECRET + "-snapshot"}, seq=2)
            art.start_run("run-u", {})
            art.append_event("run-u", "tool.called", {"q": SECRET + "-other"})
        with cli_for(origin, admin, monkeypatch) as run:
            erased = {}
            for what in ("event", "snapshot", "other"):
                done = run("forget", "--match", f"{SECRET}-{what}")
                assert done["events_erased"] + done["snapshots_erased"] == 1
                erased[what] = done["erasures"][0]["erasure_id"]
            run("export", "--fleet", FLEET, "--run", "run-t", "-o", str(run_bundle))
            run("export", "--fleet", FLEET, "-o", str(fleet_bundle))
        with ArtifactsClient(origin.artifacts.address, admin) as art:
            events = list(art.replay("run-t"))
            snapshot = art.latest_snapshot("run-t")
            other = list(art.replay("run-u"))
    assert snapshot.erasure_id == erased["snapshot"] and events[1].erasure_id == erased["event"]
    with BundleReader(run_bundle) as reader:
        reader.verify()
        assert {row["erasure_id"] for row in reader.rows("erasures")} == {
            erased["event"], erased["snapshot"]}
    with BundleReader(fleet_bundle) as reader:
        reader.verify()
        assert {row["erasure_id"] for row in reader.rows("erasures")} == set(erased.values())

    for name, bundle in (("b", run_bundle), ("c", fleet_bundle)):
        (tmp_path / name).mkdir()
        with full_stack(tmp_path / name, engram_home, make_token, governed=True) as target, \
                cli_for(target, admin, monkeypatch) as run:
            run("import-bundle", str(bundle))
            with ArtifactsClient(target.artifacts.address, admin) as art:
                assert list(art.replay("run-t")) == events
                assert art.latest_snapshot("run-t") == snapshot
                assert art.verify("run-t").snapshots_tombstoned == 1
                if bundle == fleet_bundle:
                    assert list(art.replay("run-u")) == other


def test_an_older_bundle_brings_back_nothing_an_erasure_held_here_lists(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One erasure lists an event of run-t, an event of run-u and a record. A run bundle of
    run-t carries it; imported first, it is carried out here, where run-u and the record never
    were. A fleet bundle made before the erasure then brought run-u's event and the record back
    with their content: the import carried out only the erasures the bundle itself held (found
    by review). Its last step now carries out every erasure this governance holds for the fleet
    that could list what the import created."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    before, run_bundle = tmp_path / "before.bundle", tmp_path / "run.bundle"
    with full_stack(tmp_path / "a", engram_home, make_token, governed=True) as origin:
        with ArtifactsClient(origin.artifacts.address, agent) as art:
            art.start_run("run-t", {})
            art.append_event("run-t", "tool.called", {"q": "plain"})
            in_t = art.append_event("run-t", "tool.called", {"q": SECRET + "-t"}).event
            art.start_run("run-u", {})
            in_u = art.append_event("run-u", "tool.called", {"q": SECRET + "-u"}).event
        with ShardClient(origin.shard.address, agent) as shard:
            note = shard.add(SECRET + " in a note", run_id="run-u").record
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "-o", str(before))
        with GovernanceClient(origin.governance.address, admin) as gov:
            erasure = gov.record_erasure("match", "", [
                gpb.ErasedItem(kind="event", id=f"run-t:{in_t.seq}", leaf_hash=in_t.hash),
                gpb.ErasedItem(kind="event", id=f"run-u:{in_u.seq}", leaf_hash=in_u.hash),
                gpb.ErasedItem(kind="record", id=note.id, leaf_hash=note.record_hash),
            ]).erasure
        with ArtifactsClient(origin.artifacts.address, admin) as art:
            art.forget_runs(erasure.erasure_id)
        with ShardClient(origin.shard.address, admin) as shard:
            shard.forget(erasure_id=erasure.erasure_id)
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "--run", "run-t", "-o", str(run_bundle))
    with BundleReader(run_bundle) as reader:
        reader.verify()
        assert [row["erasure_id"] for row in reader.rows("erasures")] == [erasure.erasure_id]

    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token, governed=True) as target, \
            cli_for(target, admin, monkeypatch) as run:
        run("import-bundle", str(run_bundle))
        run("import-bundle", str(before))
        with ArtifactsClient(target.artifacts.address, admin) as art:
            brought = list(art.replay("run-u"))
            assert [e.erasure_id for e in brought] == [erasure.erasure_id]
            assert SECRET not in str(brought)
            checked = art.verify("run-u")
            assert checked.events_tombstoned == 1 and not checked.tombstone_problems
            assert not checked.tombstones_unconfirmed
        with ShardClient(target.shard.address, admin) as shard:
            with pytest.raises(EngramRpcError) as gone:
                shard.get(note.id)
            assert gone.value.reason == "RECORD_ERASED"
        # As after a bundle that carried the erasure: the older one is now refused.
        assert "RECORD_ERASED" in str(run("import-bundle", str(before), code=2))
