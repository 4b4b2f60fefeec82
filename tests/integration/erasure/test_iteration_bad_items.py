"""ForgetIterations refuses an ``iteration`` item it cannot erase in place, by name, and erases
nothing of that run (docs/erasure.md): an iteration or run the fleet's logs do not hold
(NOT_FOUND), a leaf that is not the line's hash (ERASURE_MISMATCH), a format-1 line (its hash
would confirm a guess of it: FORMAT1_LINE), another fleet's erasure (NOT_FOUND)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from services.compactor.domain.warm_chain import IterationInput, WarmLine, genesis_hash
from services.compactor.servicer import summary_pb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN
from tests.integration.erasure.forged import replace_with_tombstone
from tests.stack import full_stack

FLEET = "fleet-x"


def _format1_line(run_id: str) -> cpb.IterationSummary:
    """A line recorded before salted commitments (format 1), as a bundle would bring it."""
    return summary_pb(WarmLine.chained(IterationInput(
        iteration=1, plan_digest="old", parent_digest="", start_ts="", end_ts="",
        files_touched=0, net_add=0, net_del=0, risk_score=0.0, status="ok",
        detail_json='{"n":1}', guardrails_json="null"), 1, genesis_hash(FLEET, run_id)))


def test_iteration_items_are_refused_by_name_and_nothing_is_erased(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    other = make_token("op", "fleet-y", ADMIN)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with CompactorClient(stack.compactor.address, agent) as comp:
            lines = [comp.record("run-x", iteration_from_json(
                {"iter": n, "planDigest": f"p{n}", "status": "ok", "detail": {"n": n}})).summary
                for n in (1, 2)]
        with CompactorClient(stack.compactor.address, admin) as comp:
            comp.import_iterations("run-old", [cpb.ImportedIteration(
                summary=_format1_line("run-old"), detail_json='{"n":1}',
                guardrails_json="null")])
            (old,) = comp.summaries("run-old")
        assert old.format == 1

        def item(item_id: str, leaf: str) -> gpb.ErasedItem:
            return gpb.ErasedItem(kind="iteration", id=item_id, leaf_hash=leaf)

        with GovernanceClient(stack.governance.address, admin) as gov:
            def recorded(*items: gpb.ErasedItem) -> str:
                return str(gov.record_erasure("run", "run-x", list(items)).erasure.erasure_id)

            cases = {
                recorded(item("run-x:1", lines[0].hash), item("run-x:9", lines[1].hash)):
                    (grpc.StatusCode.NOT_FOUND, "ITERATION_NOT_FOUND"),
                recorded(item("run-nope:1", lines[0].hash)):
                    (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND"),
                recorded(item("run-x:1", lines[0].hash), item("run-x:2", "00" * 32)):
                    (grpc.StatusCode.FAILED_PRECONDITION, "ERASURE_MISMATCH"),
                recorded(item("run-old:1", old.hash)):
                    (grpc.StatusCode.FAILED_PRECONDITION, "FORMAT1_LINE"),
            }
        with GovernanceClient(stack.governance.address, other) as gov:
            foreign = str(gov.record_erasure("run", "run-x", [
                item("run-x:1", lines[0].hash)]).erasure.erasure_id)
        cases[foreign] = (grpc.StatusCode.NOT_FOUND, "ERASURE_NOT_FOUND")

        with CompactorClient(stack.compactor.address, admin) as comp:
            for erasure_id, expected in cases.items():
                with pytest.raises(EngramRpcError) as refused:
                    comp.forget_iterations(erasure_id)
                assert (refused.value.code, refused.value.reason) == expected, erasure_id
            assert list(comp.summaries("run-x")) == lines  # nothing erased
            assert list(comp.summaries("run-old")) == [old]
            assert comp.reconstruct("run-x", 1).detail_json == '{"n":1}'
            report = comp.verify("run-x")
            assert report.ok and report.tombstoned == 0


def test_a_tombstone_no_erasure_lists_fails_verification(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    """Found by review (2026-11-29): a line blanked in the database into a tombstone naming an
    erasure governance never recorded verified (its kept fields give its hash). VerifyRun now
    asks governance, as VerifyArtifacts and VerifyRecords do; without governance the
    tombstones are counted unconfirmed."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    data = tmp_path / "data"
    with full_stack(data, engram_home, make_token, governed=True) as stack:
        with CompactorClient(stack.compactor.address, agent) as comp:
            for n in (1, 2, 3):
                comp.record("run-f", iteration_from_json(
                    {"iter": n, "planDigest": f"p{n}", "status": "ok", "detail": {"n": n}}))
        with closing(sqlite3.connect(data / "compactor.db")) as db:
            (text,) = db.execute("SELECT line FROM compactor_warm_lines WHERE run_id = 'run-f' "
                                 "AND iteration = 2").fetchone()
            forged = WarmLine.parse(text).tombstone("era_" + "0" * 28, 1, "nobody")
            db.execute("UPDATE compactor_warm_lines SET line = ? WHERE run_id = 'run-f' AND "
                       "iteration = 2", (forged.text(),))
            db.execute("DELETE FROM compactor_hot WHERE run_id = 'run-f' AND iteration = 2")
            db.commit()
        with CompactorClient(stack.compactor.address, admin) as comp:
            report = comp.verify("run-f")
            assert not report.ok and report.tombstoned == 1
            assert [(p.location, "TOMBSTONE_NOT_IN_ERASURE" in p.detail)
                    for p in report.problems] == [("iteration 2", True)]
            assert report.tombstones_unconfirmed == 0
        stack.governance.stop(0)  # governance gone: neither failed nor passed
        with CompactorClient(stack.compactor.address, admin) as comp:
            report = comp.verify("run-f")
            assert report.ok and report.tombstones_unconfirmed == 1


def _forge_log_tombstone(db_path: Path, run_id: str, head_hash: str, erasure_id: str) -> None:
    """An iteration log deleted behind the compactor's back, a tombstone left in its place."""
    replace_with_tombstone(
        db_path, run_id, ("compactor_hot", "compactor_warm_lines", "compactor_runs"),
        "compactor_run_tombstones", {
            "fleet_id": FLEET, "run_id": run_id, "last_iter": 2, "head_hash": head_hash,
            "erasure_id": erasure_id, "erased_us": 7, "erased_by": "op", "blobs_left": 0})


def test_verify_run_checks_a_log_erased_whole_against_its_erasure(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    """VerifyRun of a log erased whole answers what its tombstone kept (before 2026-11-30:
    NOT_FOUND, as a run never recorded), and reports a tombstone its erasure does not list."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    data = tmp_path / "data"
    with full_stack(data, engram_home, make_token, governed=True) as stack:
        heads = {}
        with CompactorClient(stack.compactor.address, agent) as comp:
            for run_id in ("run-e", "run-x", "run-y", "run-z", "run-w"):
                for n in (1, 2):
                    heads[run_id] = comp.record(run_id, iteration_from_json(
                        {"iter": n, "planDigest": f"p{n}", "status": "ok"})).summary.hash
        with GovernanceClient(stack.governance.address, admin) as gov:
            erasure = gov.record_erasure("run", "run-e", [gpb.ErasedItem(
                kind="iterations", id="run-e", leaf_hash=heads["run-e"])]).erasure.erasure_id
        with CompactorClient(stack.compactor.address, admin) as comp:
            assert [log.run_id for log in comp.forget_iterations(erasure).runs] == ["run-e"]
            report = comp.verify("run-e")
            assert (report.ok, report.erased, report.erasure_id, report.head_hash,
                    report.last_iteration, report.tombstones_unconfirmed) == (
                        True, True, erasure, heads["run-e"], 2, 0)
            assert not comp.verify("run-x").erased
            with CompactorClient(stack.compactor.address, agent) as own:  # an agent: no head
                seen = own.verify("run-e")
                assert (seen.ok, seen.erased, seen.head_hash, seen.last_iteration) == (
                    True, True, "", 0)
            with pytest.raises(EngramRpcError) as never:
                comp.verify("run-never")
            assert never.value.code == grpc.StatusCode.NOT_FOUND

        _forge_log_tombstone(data / "compactor.db", "run-x", heads["run-x"], erasure)
        _forge_log_tombstone(data / "compactor.db", "run-y", heads["run-y"], "x")
        replace_with_tombstone(  # a tombstone beside a log still recorded: the log is checked
            data / "compactor.db", "run-w", (), "compactor_run_tombstones", {
                "fleet_id": FLEET, "run_id": "run-w", "last_iter": 2,
                "head_hash": heads["run-w"], "erasure_id": erasure, "erased_us": 7,
                "erased_by": "op", "blobs_left": 0})
        with CompactorClient(stack.compactor.address, admin) as comp:
            listed_elsewhere, malformed = comp.verify("run-x"), comp.verify("run-y")
            assert (listed_elsewhere.ok, listed_elsewhere.erased) == (False, True)
            assert [(p.location, p.detail.endswith("(TOMBSTONE_NOT_IN_ERASURE)"))
                    for p in listed_elsewhere.problems] == [("log tombstone", True)]
            assert not malformed.ok
            assert malformed.problems[0].detail.endswith("(INVALID_TOMBSTONE)")
            beside = comp.verify("run-w")
            assert (beside.ok, beside.erased, beside.lines_checked) == (False, False, 2)
            assert [p.detail.endswith("(TOMBSTONE_BESIDE_LIVE_LOG)")
                    for p in beside.problems] == [True]

        stack.governance.stop(0)
        # an erasure the compactor has not read yet cannot be confirmed: neither failed nor
        # passed; one it read before is answered from what governance said then
        _forge_log_tombstone(data / "compactor.db", "run-z", heads["run-z"], "era_" + "e" * 28)
        with CompactorClient(stack.compactor.address, admin) as comp:
            unconfirmed = comp.verify("run-z")
            assert (unconfirmed.ok, unconfirmed.tombstones_unconfirmed) == (True, 1)
            assert comp.verify("run-e").ok and not comp.verify("run-x").ok
            assert not comp.verify("run-y").ok
