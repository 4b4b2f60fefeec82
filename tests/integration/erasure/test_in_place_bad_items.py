"""Erasure items of single events and snapshots (kinds ``event`` and ``snapshot``) that must be
refused, by governance when recorded and by the artifacts service when carried out: the status
and reason a client can act on, and nothing erased (one refused item leaves the erasure's
other items as they were)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from services.artifacts.domain.chain import event_hash
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN
from tests.stack import full_stack

FLEET = "fleet-x"
INVALID, NOT_FOUND, FAILED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                              grpc.StatusCode.FAILED_PRECONDITION)


def _refused(call: object, *args: object) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(EngramRpcError) as refused:
        call(*args)  # type: ignore[operator]
    return refused.value.code, refused.value.reason, refused.value.message


def _legacy_run(art: ArtifactsClient) -> tuple[apb.Event, apb.Snapshot]:
    """A run imported as an older instance wrote it: a format-1 event and snapshot."""
    run = apb.Run(run_id="run-old", agent_id="scout-1", status=apb.RUN_STATUS_RUNNING,
                  metadata_json="{}")
    run.create_time.FromMicroseconds(2_000_000)
    event = apb.Event(run_id="run-old", seq=1, type="said", payload_json='{"n":1}',
                      agent_id="scout-1")
    event.create_time.FromMicroseconds(2_000_001)
    event.hash = event_hash(prev_hash="", run_id="run-old", seq=1, type="said",
                            payload_json=event.payload_json, manifest_id="", artifact_ids=(),
                            agent_id="scout-1", created_us=2_000_001)
    snapshot = apb.Snapshot(snapshot_id="snap_old", run_id="run-old", seq=1,
                            state_json='{"n":1}',
                            state_hash=hashlib.sha256(b'{"n":1}').hexdigest())
    snapshot.create_time.FromMicroseconds(2_000_002)
    art.import_run(run)
    art.import_run_items(events=[event], snapshots=[snapshot])
    return event, snapshot


def test_event_and_snapshot_items_are_refused_by_name_and_nothing_is_erased(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    other = make_token("op", "fleet-y", ADMIN)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-x", {})
            first = art.append_event("run-x", "tool.called", {"q": "kept"}).event
            art.append_event("run-x", "tool.called", {"q": "also kept"})
            snap = art.create_snapshot("run-x", {"s": "kept"}, seq=1)
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            old_event, old_snapshot = _legacy_run(art)

        def item(kind: str, item_id: str, leaf: str) -> gpb.ErasedItem:
            return gpb.ErasedItem(kind=kind, id=item_id, leaf_hash=leaf)

        with GovernanceClient(stack.governance.address, admin) as gov:
            for bad_id in ("run-x", "run-x:0", "run-x:01", "run-x:-1", "run-x:1.5", ":1",
                           "run-x:\u0661"):  # an Arabic-Indic digit one
                code, reason, _ = _refused(gov.record_erasure, "run", "run-x",
                                           [item("event", bad_id, first.hash)])
                assert (code, reason) == (INVALID, "INVALID_ITEM"), bad_id
            code, reason, _ = _refused(gov.record_erasure, "run", "run-x",
                                       [item("snapshot", snap.snapshot_id, "xyz")])
            assert (code, reason) == (INVALID, "INVALID_ITEM")

            def recorded(*items: gpb.ErasedItem) -> str:
                return str(gov.record_erasure("run", "run-x", list(items)).erasure.erasure_id)

            unknown_seq = recorded(item("event", "run-x:99", first.hash))
            unknown_run = recorded(item("event", "run-nope:1", first.hash))
            unknown_snap = recorded(item("snapshot", "snap_nope", snap.state_hash))
            mismatch = recorded(item("event", "run-x:1", "00" * 32))
            snap_mismatch = recorded(item("snapshot", snap.snapshot_id, "00" * 32))
            legacy = recorded(item("event", "run-x:1", first.hash),  # the good one first
                              item("event", "run-old:1", old_event.hash))
            legacy_snap = recorded(item("snapshot", snap.snapshot_id, snap.state_hash),
                                   item("snapshot", "snap_old", old_snapshot.state_hash))
        with GovernanceClient(stack.governance.address, other) as gov:
            foreign = str(gov.record_erasure("run", "run-x", [
                item("event", "run-x:1", first.hash),
                item("snapshot", snap.snapshot_id, snap.state_hash)]).erasure.erasure_id)
            foreign_snap = str(gov.record_erasure("run", "run-x", [
                item("snapshot", snap.snapshot_id, snap.state_hash)]).erasure.erasure_id)

        with ArtifactsClient(stack.artifacts.address, admin) as art:
            for erasure_id, expected in (
                    (unknown_seq, (NOT_FOUND, "EVENT_NOT_FOUND")),
                    (unknown_run, (NOT_FOUND, "EVENT_NOT_FOUND")),
                    (unknown_snap, (NOT_FOUND, "SNAPSHOT_NOT_FOUND")),
                    (mismatch, (FAILED, "ERASURE_MISMATCH")),
                    (snap_mismatch, (FAILED, "ERASURE_MISMATCH")),
                    (legacy_snap, (FAILED, "LEGACY_EVENT")),
                    (foreign, (NOT_FOUND, "ERASURE_NOT_FOUND"))):  # another fleet's: absent
                assert _refused(art.forget_runs, erasure_id)[:2] == expected, erasure_id
            code, reason, message = _refused(art.forget_runs, legacy)
            assert (code, reason) == (FAILED, "LEGACY_EVENT")
            assert "whole run" in message
        with ArtifactsClient(stack.artifacts.address, other) as art:
            # fleet-y's own erasure naming fleet-x's event and snapshot: not held in fleet-y
            assert _refused(art.forget_runs, foreign)[:2] == (NOT_FOUND, "EVENT_NOT_FOUND")
            assert _refused(art.forget_runs, foreign_snap)[:2] == (NOT_FOUND,
                                                                   "SNAPSHOT_NOT_FOUND")
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            assert _refused(art.forget_runs, legacy)[:2] == (grpc.StatusCode.PERMISSION_DENIED,
                                                             "ROLE_REQUIRED")
        with ArtifactsClient(stack.artifacts.address, admin) as art:  # nothing was erased
            assert [bool(e.payload_json) and not e.erasure_id
                    for e in art.replay("run-x")] == [True, True]
            assert art.list_events("run-old").__next__().payload_json == '{"n":1}'
            assert {s.snapshot_id: s.state_json for s in art.list_snapshots("run-x")} == {
                snap.snapshot_id: '{"s":"kept"}'}
            assert art.latest_snapshot("run-old").state_json == '{"n":1}'
