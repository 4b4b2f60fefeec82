"""VerifyArtifacts checks every tombstone (an event or snapshot erased in place) against the
erasure governance recorded (docs/erasure.md), through real servers: content blanked in the
database under a tombstone no recorded erasure of the fleet lists (another fleet's erasure, an
erasure id governance never issued, a real erasure of the fleet that lists other items) is
reported TOMBSTONE_NOT_IN_ERASURE naming the item, one not of a tombstone's form is
INVALID_TOMBSTONE (and breaks the chain on replay), while a genuine erasure's tombstones pass.
With governance down the call still answers: erasures governance answered before still answer
(the service keeps them), and the tombstones of one it never answered are counted
unconfirmed."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.integration.erasure.forged import replace_with_tombstone
from tests.stack import full_stack

FLEET = "fleet-a"


def _forge(db_path: Path, sql: str, *args: object) -> None:
    with closing(sqlite3.connect(db_path)) as db:
        db.execute(sql, args)
        db.commit()


def _blank_event(db_path: Path, run_id: str, seq: int, erasure_id: str) -> None:
    """What someone with write access to the database does: no erasure, no governance."""
    _forge(db_path, "UPDATE events SET payload_json='', salt='', erasure_id=?, erased_us=7, "
           "erased_by='op' WHERE run_id=? AND seq=?", erasure_id, run_id, seq)


def test_verify_reports_tombstones_no_recorded_erasure_lists(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    other_admin = make_token("op", "fleet-b", ADMIN)
    data = tmp_path / "data"
    db = data / "artifacts.db"
    with full_stack(data, engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-t", {})
            events = [art.append_event("run-t", "said", {"text": f"evidence {n}"}).event
                      for n in range(1, 6)]
            kept_snap = art.create_snapshot("run-t", {"s": 1}, seq=1)
            forged_snap = art.create_snapshot("run-t", {"s": 2}, seq=2)
            art.start_run("run-g", {})
            good = art.append_event("run-g", "said", {"text": "to forget"}).event
            art.start_run("run-u", {})
            art.append_event("run-u", "said", {"text": "blanked while governance is down"})
        with GovernanceClient(stack.governance.address, admin) as gov:
            genuine = gov.record_erasure("match", "", [
                gpb.ErasedItem(kind="event", id="run-t:1", leaf_hash=events[0].hash),
                gpb.ErasedItem(kind="snapshot", id=kept_snap.snapshot_id,
                               leaf_hash=kept_snap.state_hash),
                gpb.ErasedItem(kind="event", id="run-g:1", leaf_hash=good.hash),
            ], reason="subject asked").erasure.erasure_id
        with GovernanceClient(stack.governance.address, other_admin) as gov:
            # another fleet's erasure listing this very event: not this fleet's to erase
            elsewhere = gov.record_erasure("match", "", [
                gpb.ErasedItem(kind="event", id="run-t:2", leaf_hash=events[1].hash),
            ]).erasure.erasure_id
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            done = art.forget_runs(genuine)
            assert (done.events_erased, done.snapshots_erased) == (2, 1)
            clean = art.verify()
            assert not clean.tombstone_problems and not clean.snapshot_problems
            assert (clean.events_tombstoned, clean.snapshots_tombstoned,
                    clean.tombstones_unconfirmed) == (2, 1, 0)

        _blank_event(db, "run-t", 2, elsewhere)
        _blank_event(db, "run-t", 3, "era_" + "f" * 28)  # an erasure never recorded
        _blank_event(db, "run-t", 4, genuine)  # a real erasure that does not list it
        _blank_event(db, "run-t", 5, "x")  # not even an erasure id
        _forge(db, "UPDATE snapshots SET state_json='', salt='', erasure_id=?, erased_us=7 "
               "WHERE snapshot_id=?", genuine, forged_snap.snapshot_id)

        forged = {("event", "run-t:2", "TOMBSTONE_NOT_IN_ERASURE", elsewhere),
                  ("event", "run-t:3", "TOMBSTONE_NOT_IN_ERASURE", "era_" + "f" * 28),
                  ("event", "run-t:4", "TOMBSTONE_NOT_IN_ERASURE", genuine),
                  ("event", "run-t:5", "INVALID_TOMBSTONE", "x"),
                  ("snapshot", forged_snap.snapshot_id, "TOMBSTONE_NOT_IN_ERASURE", genuine)}
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            for run_id in ("run-t", ""):  # the run asked, and the whole fleet
                report = art.verify(run_id)
                assert {(p.kind, p.id, p.problem, p.erasure_id)
                        for p in report.tombstone_problems} == forged
                assert (report.events_tombstoned, report.snapshots_tombstoned,
                        report.tombstones_unconfirmed) == (
                            5 if run_id else 6, 2, 0)
                leaves = {p.id: p.leaf_hash for p in report.tombstone_problems}
                assert leaves["run-t:2"] == events[1].hash
                assert leaves[forged_snap.snapshot_id] == forged_snap.state_hash
            assert not art.verify("run-g").tombstone_problems  # the genuine erasure's
            # the chain check (no governance call) refuses a tombstone not of the form
            with pytest.raises(EngramRpcError) as broken:
                list(art.replay("run-t"))
            assert (broken.value.code, broken.value.reason) == (
                grpc.StatusCode.DATA_LOSS, "EVENT_CHAIN_BROKEN")
            assert broken.value.metadata.get("seq") == "5"

        with cli_for(stack, admin, monkeypatch) as run:
            shown = run("artifacts", "verify", "--run", "run-t", code=1)
            assert len(shown["tombstone_problems"]) == 5
            assert shown["tombstones_unconfirmed"] == 0
            assert run("artifacts", "verify", "--run", "run-g")["events_tombstoned"] == 1

        stack.governance.stop(0)
        # Governance down. An erasure it answered before still answers (a recorded erasure
        # never changes; the service keeps what it read, so a caller paging verifications does
        # not make it ask again); one it never answered cannot be confirmed: neither failed
        # nor passed.
        _blank_event(db, "run-u", 1, "era_" + "e" * 28)
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            report = art.verify("run-t")
            assert {(p.id, p.problem) for p in report.tombstone_problems} == {
                (item, problem) for _, item, problem, _ in forged} - {
                ("run-t:3", "TOMBSTONE_NOT_IN_ERASURE")}
            assert report.tombstones_unconfirmed == 1  # era_fff…: never recorded, never kept
            assert art.verify("run-g").tombstones_unconfirmed == 0
        with cli_for(stack, admin, monkeypatch) as run:
            unconfirmed = run("artifacts", "verify", "--run", "run-u", code=2)
            assert (unconfirmed["tombstones_unconfirmed"],
                    unconfirmed["tombstone_problems"]) == (1, [])


def _forge_run_tombstone(db_path: Path, run_id: str, head_hash: str, erasure_id: str) -> None:
    """A run deleted behind the service's back, a tombstone left in its place."""
    replace_with_tombstone(db_path, run_id, ("events", "snapshots", "runs"), "run_tombstones", {
        "fleet_id": FLEET, "run_id": run_id, "agent_id": "scout-1", "created_us": 1,
        "event_count": 1, "head_hash": head_hash, "erasure_id": erasure_id, "erased_us": 7,
        "erased_by": "op", "blobs_left_json": "[]"})


def test_verify_checks_every_run_erased_whole_against_its_erasure(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    data = tmp_path / "data"
    db = data / "artifacts.db"
    with full_stack(data, engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            heads = {}
            for run_id in ("run-e", "run-x", "run-y"):
                art.start_run(run_id, {})
                heads[run_id] = art.append_event(run_id, "said", {"n": run_id}).event.hash
            art.start_run("run-empty", {})  # erased before any event: its leaf is 64 zeros
        with cli_for(stack, admin, monkeypatch) as run:
            erasure = run("forget", "--run", "run-e")["erasures"][0]["erasure_id"]
            run("forget", "--run", "run-empty")
            clean = run("artifacts", "verify")
            assert (clean["runs_tombstoned"], clean.get("tombstone_problems", [])) == (2, [])
            assert run("artifacts", "verify", "--run", "run-x")["runs_tombstoned"] == 0

        _forge_run_tombstone(db, "run-x", heads["run-x"], erasure)  # an erasure of run-e only
        _forge_run_tombstone(db, "run-y", heads["run-y"], "x")  # names no erasure at all
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            report = art.verify()
            assert report.runs_tombstoned == 4
            assert {(p.kind, p.id, p.run_id, p.problem, p.erasure_id, p.leaf_hash)
                    for p in report.tombstone_problems} == {
                ("run", "run-x", "run-x", "TOMBSTONE_NOT_IN_ERASURE", erasure, heads["run-x"]),
                ("run", "run-y", "run-y", "INVALID_TOMBSTONE", "x", heads["run-y"])}
            assert report.tombstones_unconfirmed == 0
        with cli_for(stack, admin, monkeypatch) as run:
            assert len(run("artifacts", "verify", code=1)["tombstone_problems"]) == 2

        stack.governance.stop(0)  # the erasures it answered before still answer
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            report = art.verify()
            assert [(p.id, p.problem) for p in report.tombstone_problems] == [
                ("run-x", "TOMBSTONE_NOT_IN_ERASURE"), ("run-y", "INVALID_TOMBSTONE")]
            assert (report.runs_tombstoned, report.tombstones_unconfirmed) == (4, 0)
