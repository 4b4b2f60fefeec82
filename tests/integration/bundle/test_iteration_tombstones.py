"""Iterations erased in place travel in bundles as tombstones (docs/bundle.md,
docs/erasure.md): the target takes one only when an erasure it holds lists it under its kept
hash, verifies the log through it and reads it without content; a bundle made before the
erasure brings the content back nowhere (imported before, the import's last step erases it).
ImportIterations refuses a tombstone without its erasure, one its erasure does not list, and
malformed tombstone fields, storing nothing."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.stack import full_stack

FLEET = "fleet-a"
SECRET = "zqxbundled-line"


def _copy(summary: cpb.IterationSummary, **changes: object) -> cpb.ImportedIteration:
    copied = cpb.IterationSummary()
    copied.CopyFrom(summary)
    detail = str(changes.pop("detail_json", ""))
    for name, value in changes.items():
        if name == "erase_us":
            copied.erase_time.FromMicroseconds(int(str(value)))
        elif name == "erase_seconds":  # past what FromMicroseconds takes
            copied.erase_time.seconds = int(str(value))
        elif name == "no_erase_time":
            copied.ClearField("erase_time")
        else:
            setattr(copied, name, value)
    return cpb.ImportedIteration(summary=copied, detail_json=detail)


def _refused(comp: CompactorClient, item: cpb.ImportedIteration) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(EngramRpcError) as refused:
        comp.import_iterations("run-t", [item])
    return refused.value.code, refused.value.reason


def test_an_iteration_erased_in_place_travels_as_a_tombstone(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    before, after = tmp_path / "before.bundle", tmp_path / "after.bundle"
    run_bundle = tmp_path / "run.bundle"
    with full_stack(tmp_path / "a", engram_home, make_token, governed=True) as origin:
        with ArtifactsClient(origin.artifacts.address, agent) as art:
            art.start_run("run-t", {})  # a bundle carries the logs of the fleet's runs
        with CompactorClient(origin.compactor.address, agent) as comp:
            for n, detail in ((1, "plain"), (2, SECRET), (3, "after")):
                comp.record("run-t", iteration_from_json(
                    {"iter": n, "planDigest": f"p{n}", "status": "ok", "detail": {"q": detail}}))
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "-o", str(before))
            done = run("forget", "--match", SECRET)
            assert done["iterations_erased"] == 1
            run("export", "--fleet", FLEET, "-o", str(after))
            # a run bundle carries the erasure its tombstone names (found by review: it did
            # not, and the bundle could not be imported anywhere: ERASURE_NOT_FOUND)
            run("export", "--fleet", FLEET, "--run", "run-t", "-o", str(run_bundle))
        erasure_id = done["erasures"][0]["erasure_id"]
        with CompactorClient(origin.compactor.address, admin) as comp:
            lines = list(comp.summaries("run-t"))
    tombstone = lines[1]
    assert tombstone.erasure_id == erasure_id and not tombstone.plan_digest

    # the newer bundle, then the older: the tombstone stays
    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token, governed=True) as target, \
            cli_for(target, admin, monkeypatch) as run:
        assert run("import-bundle", str(after))["not_imported"] == {}
        with CompactorClient(target.compactor.address, admin) as comp:
            assert list(comp.summaries("run-t")) == lines
            report = comp.verify("run-t")
            assert report.ok and report.tombstoned == 1
            assert comp.reconstruct("run-t", 3).detail_json == '{"q":"after"}'
        run("import-bundle", str(before))
        with CompactorClient(target.compactor.address, admin) as comp:
            assert list(comp.summaries("run-t")) == lines  # nothing brought back
            assert not comp.reconstruct("run-t", 2).detail_json

    (tmp_path / "r").mkdir()
    with full_stack(tmp_path / "r", engram_home, make_token, governed=True) as target, \
            cli_for(target, admin, monkeypatch) as run:
        assert run("import-bundle", str(run_bundle))["not_imported"] == {}
        with CompactorClient(target.compactor.address, admin) as comp:
            assert list(comp.summaries("run-t")) == lines
            assert comp.verify("run-t").tombstoned == 1

    # the older bundle, then the newer: its last step erases the line the older brought
    (tmp_path / "c").mkdir()
    with full_stack(tmp_path / "c", engram_home, make_token, governed=True) as target, \
            cli_for(target, admin, monkeypatch) as run:
        run("import-bundle", str(before))
        with CompactorClient(target.compactor.address, admin) as comp:
            assert SECRET in comp.reconstruct("run-t", 2).detail_json
        run("import-bundle", str(after))
        with CompactorClient(target.compactor.address, admin) as comp:
            again = list(comp.summaries("run-t"))
            assert [s.hash for s in again] == [s.hash for s in lines]
            assert again[1].erasure_id == erasure_id and not again[1].plan_digest
            assert not comp.reconstruct("run-t", 2).detail_json
            assert comp.verify("run-t").ok

    # ImportIterations on a target holding the log's first line only
    (tmp_path / "d").mkdir()
    with full_stack(tmp_path / "d", engram_home, make_token, governed=True) as target, \
            CompactorClient(target.compactor.address, admin) as comp:
        comp.import_iterations("run-t", [cpb.ImportedIteration(summary=lines[0])])
        assert _refused(comp, _copy(tombstone)) == (
            grpc.StatusCode.NOT_FOUND, "ERASURE_NOT_FOUND")  # no such erasure here
        with GovernanceClient(target.governance.address, admin) as gov:
            other = gov.record_erasure("run", "run-t", [gpb.ErasedItem(
                kind="iteration", id="run-t:3", leaf_hash=lines[2].hash)]).erasure
        for bad, expected in (
                (_copy(tombstone, erasure_id=other.erasure_id),  # lists another iteration
                 (grpc.StatusCode.FAILED_PRECONDITION, "TOMBSTONE_NOT_IN_ERASURE")),
                (_copy(tombstone, no_erase_time=True),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")),
                (_copy(tombstone, erasure_id="nope"),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")),
                (_copy(tombstone, erased_by="a b"),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER")),
                (_copy(lines[2], erased_by="op"),  # fields of a tombstone, no erasure
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE")),
                (_copy(lines[2], erase_us=5),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE"))):
            assert _refused(comp, bad) == expected, bad
        with GovernanceClient(target.governance.address, admin) as gov:
            listed = gov.record_erasure("run", "run-t", [gpb.ErasedItem(
                kind="iteration", id="run-t:2", leaf_hash=tombstone.hash)]).erasure
        for bad, expected in (
                (_copy(tombstone, erasure_id=listed.erasure_id, detail_json='{"q":"x"}'),
                 (grpc.StatusCode.INVALID_ARGUMENT, "TOMBSTONE_WITH_DETAIL")),
                (_copy(tombstone, erasure_id=listed.erasure_id, detail_digest="ab" * 32),
                 (grpc.StatusCode.INVALID_ARGUMENT, "ITERATION_HASH_MISMATCH")),
                (_copy(tombstone, erasure_id=listed.erasure_id, format=1),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FORMAT")),
                # found by review: another eraser than the erasure's (was taken), an erase
                # time no timestamp holds (was INTERNAL)
                (_copy(tombstone, erasure_id=listed.erasure_id, erased_by="ceo"),
                 (grpc.StatusCode.FAILED_PRECONDITION, "TOMBSTONE_NOT_IN_ERASURE")),
                (_copy(tombstone, erasure_id=listed.erasure_id, erase_seconds=10**12),
                 (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE"))):
            assert _refused(comp, bad) == expected, bad
        assert [s.iteration for s in comp.summaries("run-t")] == [1]  # nothing stored
        # listed, under its hash: taken, and the log goes on through it
        taken = comp.import_iterations("run-t", [_copy(tombstone, erasure_id=listed.erasure_id),
                                                 cpb.ImportedIteration(summary=lines[2])])
        assert taken.created == 2
        report = comp.verify("run-t")
        assert report.ok and report.tombstoned == 1
