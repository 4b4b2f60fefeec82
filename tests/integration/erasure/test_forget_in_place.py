"""Erasing single events and snapshots of a kept run (docs/erasure.md, issue 17), through real
servers on SQLite and Postgres: ``engram forget --match`` tombstones the format-2 event and
snapshot holding a planted marker in place (the run, its head and its other items kept), and
afterwards the marker, its plain SHA-256, the link a payload-hashing chain would give a guess
and the erased salts are in no byte under the data directories and $ENGRAM_HOME (database files
and their WAL) and in no table; replay, rehydrate and reads return the tombstones without
content, marked erased; the chain verifies and counts them; carrying the erasure out again
changes nothing."""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.cli import forget as forget_command
from engram.cli.main import app
from engram.client.artifacts import ArtifactsClient
from engram.client.governance import GovernanceClient
from services.artifacts import erasure as artifacts_erasure
from services.artifacts.domain.chain import event_hash
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.integration.erasure.test_forget import _files_holding, _tables_holding
from tests.stack import full_stack

FLEET = "fleet-p"


def _guesses(event: apb.Event, snapshot: apb.Snapshot) -> list[str]:
    """What a guess of the erased payload or state would confirm without their salts: their
    plain SHA-256 and the event's link as a payload-hashing (format-1) chain makes it."""
    return [hashlib.sha256(event.payload_json.encode()).hexdigest(),
            hashlib.sha256(snapshot.state_json.encode()).hexdigest(),
            event_hash(prev_hash=event.prev_hash, run_id=event.run_id, seq=event.seq,
                       type=event.type, payload_json=event.payload_json,
                       manifest_id=event.manifest_id, artifact_ids=tuple(event.artifact_ids),
                       agent_id=event.agent_id, created_us=event.create_time.ToMicroseconds())]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_forget_match_erases_events_and_snapshots_in_place(
        backend: str, tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    urls = ({name: request.getfixturevalue("fresh_postgres_urls")()
             for name in ("shard", "governance", "artifacts", "compactor")}
            if backend == "postgres" else {})
    marker = "zqxplace" + secrets.token_hex(6)
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    data = tmp_path / "data"
    with full_stack(data, engram_home, make_token, urls, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-k", {"goal": "kept"})
            art.append_event("run-k", "tool.called", {"q": "first"})
            planted = art.append_event("run-k", "tool.called", {"query": marker}).event
            clean = art.create_snapshot("run-k", {"clean": 1}, seq=1)
            held = art.create_snapshot("run-k", {"seen": marker}, seq=2)
            third = art.append_event("run-k", "tool.result", {"ok": True}).event
            head = art.get_run("run-k")
        needles = [marker, *_guesses(planted, held), planted.salt, held.salt]
        if backend == "sqlite":  # the scan can fail: before the erasure it finds the marker
            with closing(sqlite3.connect(data / "artifacts.db")) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert _files_holding([data], [marker.encode()])
        else:
            assert _tables_holding(urls["artifacts"], needles)

        with cli_for(stack, admin, monkeypatch) as run:
            dry = run("forget", "--match", marker, "--dry-run")
            assert {(i["kind"], i["id"], i["leaf_hash"]) for i in dry["would_erase"]} == {
                ("event", "run-k:2", planted.hash), ("snapshot", held.snapshot_id,
                                                     held.state_hash)}
            assert dry["runs_holding_text"] == []  # nothing needs the whole run
            with ArtifactsClient(stack.artifacts.address, admin) as art:
                assert list(art.list_events("run-k"))[1].payload_json  # the dry run: nothing
            done = run("forget", "--match", marker, "--reason", "subject asked")
            assert (done["events_erased"], done["snapshots_erased"]) == (1, 1)
            assert done["runs_holding_text"] == [] and done["erasures"][0]["runs"] == []
            erasure_id = done["erasures"][0]["erasure_id"]
            again = run("forget", "--match", marker)
            assert (again["erased"], again["events_erased"], again["erasures"]) == (0, 0, [])
            verified = run("events", "verify", "run-k")
            assert (verified["events"], verified["tombstoned"]) == (3, 1)

        with ArtifactsClient(stack.artifacts.address, admin) as art:
            kept = art.get_run("run-k")  # the run is kept, its head unchanged
            assert (kept.event_count, kept.head_hash) == (3, head.head_hash)
            replayed = list(art.replay("run-k"))
            assert [e.seq for e in replayed] == [1, 2, 3]
            erased = replayed[1]
            assert (erased.erasure_id, erased.erased_by) == (erasure_id, "op")
            assert erased.erase_time.ToMicroseconds() > 0
            assert (erased.payload_json, erased.salt) == ("", "")
            assert (erased.hash, erased.payload_commitment, erased.type) == (
                planted.hash, planted.payload_commitment, planted.type)
            assert replayed[0].payload_json and not replayed[0].erasure_id
            assert replayed[2] == third
            view = art.rehydrate("run-k")
            assert view.snapshot.snapshot_id == held.snapshot_id
            assert (view.snapshot.state_json, view.snapshot.salt) == ("", "")
            assert view.snapshot.erasure_id == erasure_id
            assert view.snapshot.state_hash == held.state_hash
            assert [e.seq for e in view.events] == [3]
            assert art.latest_snapshot("run-k").erasure_id == erasure_id
            listed = {s.snapshot_id: s for s in art.list_snapshots("run-k")}
            assert listed[clean.snapshot_id] == clean
            report = art.verify("run-k")
            assert not report.snapshot_problems and not report.problems
            assert (report.snapshots_checked, report.snapshots_tombstoned) == (2, 1)
            # carried out again: nothing changes
            resumed = art.forget_runs(erasure_id)
            assert (resumed.events_erased, resumed.snapshots_erased,
                    resumed.items_already_erased) == (0, 0, 2)
            assert list(art.replay("run-k")) == replayed
            assert not art.find_runs(marker).runs
        with GovernanceClient(stack.governance.address, admin) as gov:
            recorded = gov.erasure(erasure_id)
            assert {(i.kind, i.id) for i in recorded.items} == {
                ("event", "run-k:2"), ("snapshot", held.snapshot_id)}
            assert gov.verify_chain().ok

        assert _files_holding([data, engram_home], [n.encode() for n in needles]) == []
        for url in urls.values():
            assert _tables_holding(url, needles) == []


def test_forget_agent_reaches_its_events_in_other_agents_runs(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", FLEET, ADMIN)
    owner, visitor = make_token("scout-1", FLEET), make_token("scout-2", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, owner) as art:
            art.start_run("run-o", {})
            art.append_event("run-o", "tool.called", {"by": "owner"})
        with ArtifactsClient(stack.artifacts.address, visitor) as art:
            art.start_run("run-v", {})
            art.append_event("run-v", "tool.called", {"by": "visitor, own run"})
            visit = art.append_event("run-o", "tool.called", {"by": "visitor"}).event
        with ArtifactsClient(stack.artifacts.address, owner) as art:
            art.append_event("run-o", "tool.result", {"by": "owner again"})
        with cli_for(stack, admin, monkeypatch) as run:
            dry = run("forget", "--agent", "scout-2", "--dry-run")
            assert sorted((i["kind"], i["id"]) for i in dry["would_erase"]) == [
                ("event", "run-o:2"), ("run", "run-v")]
            done = run("forget", "--agent", "scout-2")
            assert done["events_erased"] == 1
            assert [r["run_id"] for r in done["erasures"][0]["runs"]] == ["run-v"]
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            events = list(art.replay("run-o"))  # the owner's run is kept and verifies
            assert [(e.agent_id, bool(e.erasure_id)) for e in events] == [
                ("scout-1", False), ("scout-2", True), ("scout-1", False)]
            assert events[1].hash == visit.hash and not events[1].payload_json


def test_many_items_are_found_in_pages_and_erased_in_rounds(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FindRuns lists at most one erasure's items (``more`` past that), and the CLI puts at most
    EXTRA_PER_ROUND of them in one erasure, the rest in the next rounds (both made small)."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            for run_id in ("run-1", "run-2"):
                art.start_run(run_id, {})
                for n in range(2):
                    art.append_event(run_id, "said", {"text": f"zqxmany {n}"})
        with monkeypatch.context() as patch, \
                ArtifactsClient(stack.artifacts.address, admin) as art:
            patch.setattr(artifacts_erasure, "MAX_ERASURE_ITEMS", 3)
            found = art.find_runs("zqxmany")
            assert ([len(r.items) for r in found.runs], found.more) == ([2], True)
            patch.setattr(artifacts_erasure, "MAX_ERASURE_ITEMS", 1)
            found = art.find_runs("zqxmany")
            assert ([len(r.items) for r in found.runs], found.more) == ([1], True)
        monkeypatch.setattr(forget_command, "EXTRA_PER_ROUND", 3)
        with cli_for(stack, admin, monkeypatch) as run:
            done = run("forget", "--match", "zqxmany")
            assert done["events_erased"] == 4
            assert [e["events_erased"] for e in done["erasures"]] == [3, 1]
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            assert all(e.erasure_id for r in ("run-1", "run-2") for e in art.replay(r))


def test_forget_match_follows_every_page_of_the_finds(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FindRuns lists one page (at most one erasure's items, made 3 here) and a token for the
    rest: ``engram forget --match`` follows every page before erasing, so ``--dry-run`` lists
    every event and snapshot holding the text and the erasure erases them all (found by
    review: the CLI read one page and reported success; later it found again after each
    round, and a dry run listed the first page only)."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            for run_id in ("run-1", "run-2", "run-3"):
                art.start_run(run_id, {})
                for n in range(2):
                    art.append_event(run_id, "said", {"text": f"zqxpages {n}"})
            art.create_snapshot("run-3", {"seen": "zqxpages"}, seq=2)
        monkeypatch.setattr(artifacts_erasure, "MAX_ERASURE_ITEMS", 3)  # stands for 10,000
        with cli_for(stack, admin, monkeypatch) as run:
            dry = run("forget", "--match", "zqxpages", "--dry-run")
            assert len(dry["would_erase"]) == 7 and "incomplete" not in dry
            done = run("forget", "--match", "zqxpages")
            assert (done["events_erased"], done["snapshots_erased"]) == (6, 1)
            assert done["runs_holding_text"] == []
            dry = run("forget", "--match", "zqxpages", "--dry-run")
            assert dry["would_erase"] == []
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            assert all(e.erasure_id for r in ("run-1", "run-2", "run-3") for e in art.replay(r))
            assert art.latest_snapshot("run-3").erasure_id


def test_forget_match_goes_past_runs_only_erasing_whole_clears(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A find's page filled with runs that only erasing whole removes the text from (one run
    a page here) does not hide the runs past it: their events are erased in place and the
    whole-run ones are named (before the page tokens the CLI had to fail here, exit 1,
    FORGET_INCOMPLETE); ``--whole-runs`` erases those too."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-meta", {"goal": "zqxstuck"})  # only erasing it whole removes it
            art.start_run("run-late", {})
            art.append_event("run-late", "said", {"text": "zqxstuck"})
        monkeypatch.setattr(forget_command, "FIND_PAGE", 1)  # stands for 1,000
        with cli_for(stack, admin, monkeypatch) as run:
            # exit 3: what could be erased is, but the text is left (a script must not read 0)
            done = run("forget", "--match", "zqxstuck", code=3)
            assert (done["events_erased"], done["runs_holding_text"]) == (1, ["run-meta"])
            with ArtifactsClient(stack.artifacts.address, admin) as art:
                assert all(e.erasure_id for e in art.replay("run-late"))
                assert [r.run_id for r in art.find_runs("zqxstuck").runs] == ["run-meta"]
            # again, as a person reads it: nothing more erased, but not "nothing matches"
            shown = CliRunner().invoke(app, ["forget", "--match", "zqxstuck"])
            assert shown.exit_code == 3
            assert "nothing erased" in shown.output and "nothing matches" not in shown.output
            assert "run-meta" in shown.output and "--whole-runs" in shown.output
            done = run("forget", "--match", "zqxstuck", "--whole-runs")
            assert sorted(r["run_id"] for e in done["erasures"] for r in e["runs"]) == [
                "run-meta"]
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            assert not art.find_runs("zqxstuck").runs
