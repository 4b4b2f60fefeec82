"""ImportRun, ImportArtifact and ImportRunItems between two real artifacts servers, on SQLite
and Postgres: a run moves with its ids, authors, times and hash chain and serves the same
(rehydrate, replay, verify); importing twice changes nothing; admin of the same fleet only;
every altered, out-of-order or unbounded input is refused by name with nothing stored."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from services.artifacts.domain.chain import event_hash
from services.artifacts.tables import RunTombstoneRow
from tests.conftest import TokenFactory
from tests.integration.artifacts.conftest import RunningArtifacts, running_artifacts

BLOB = b"observation line\n" * 3000


@dataclass
class Origin:
    run: pb.Run
    artifact: pb.Artifact
    manifests: list[pb.Manifest]
    evidence: list[pb.Evidence]
    events: list[pb.Event]
    snapshots: list[pb.Snapshot]


@pytest.fixture
def pair(artifacts_db_url: str, tmp_path: Path, engram_home: Path,
         make_token: TokenFactory) -> Iterator[tuple[RunningArtifacts, RunningArtifacts]]:
    (tmp_path / "origin").mkdir()
    with running_artifacts(f"sqlite:///{tmp_path / 'origin' / 'a.db'}", tmp_path / "origin",
                           engram_home, make_token) as origin, \
            running_artifacts(artifacts_db_url, tmp_path / "target", engram_home,
                              make_token) as target:
        yield origin, target


def admin_of(server: RunningArtifacts, make_token: TokenFactory,
             fleet: str = "fleet-a") -> ArtifactsClient:
    return ArtifactsClient(server.server.address, make_token("op", fleet, ("admin",)),
                           timeout=30)


def written(origin: RunningArtifacts) -> Origin:
    """A stopped run with an artifact, a manifest, evidence, three events and two snapshots,
    the newest at the lower seq."""
    art = origin.client_for(agent="scout-1")
    art.start_run("run-1", {"goal": "move"})
    out = art.upload([BLOB], run_id="run-1", step_id="plan", name="notes/out.txt",
                     mime_type="text/plain")
    manifest = art.create_manifest({"files": ["out.txt"]}, run_id="run-1").manifest
    art.append_event("run-1", "tool.called", {"tool": "search"},
                     manifest_id=manifest.manifest_id, artifact_ids=[out.artifact_id])
    art.append_event("run-1", "tool.done", {"ok": True})
    art.create_snapshot("run-1", {"step": 2}, seq=2, artifact_ids=[out.artifact_id])
    art.create_snapshot("run-1", {"step": 1}, seq=1)
    art.create_evidence("corpus-1", "index-1", "chunk-9", 0, 10, artifact_id=out.artifact_id)
    art.stop_run("run-1", "succeeded", "done")
    return Origin(art.get_run("run-1"), out, [manifest],
                  list(art.paginate(art.stub.ListEvidence, pb.ListEvidenceRequest(),
                                    lambda reply: reply.evidence)),
                  list(art.list_events("run-1")), list(art.list_snapshots("run-1")))


def imported(client: ArtifactsClient, run: Origin) -> list[tuple[int, int]]:
    counts = []
    reply = client.import_run(run.run)
    counts.append((int(reply.created), int(not reply.created)))
    artifact = client.import_artifact(run.artifact, [BLOB[:1000], BLOB[1000:]])
    counts.append((int(artifact.created), int(not artifact.created)))
    items = client.import_run_items(manifests=run.manifests, evidence=run.evidence,
                                    events=run.events,
                                    snapshots=sorted(run.snapshots, key=lambda s: s.seq))
    counts.append((items.created, items.already_present))
    return counts


def refused(call: object, *args: object, **kwargs: object) -> EngramRpcError:
    with pytest.raises(EngramRpcError) as failure:
        call(*args, **kwargs)  # type: ignore[operator]
    return failure.value


def test_a_run_moves_whole_and_a_second_import_changes_nothing(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with admin_of(origin, make_token) as source, admin_of(target, make_token) as client:
        assert imported(client, run) == [(1, 0), (1, 0), (7, 0)]
        assert imported(client, run) == [(0, 1), (0, 1), (0, 7)]
        for reader in (source, client):
            assert not reader.verify("run-1").problems
        assert client.get_run("run-1") == source.get_run("run-1")
        assert list(client.replay("run-1")) == list(source.replay("run-1"))
        assert client.rehydrate("run-1") == source.rehydrate("run-1")
        assert client.latest_snapshot("run-1").seq == 1  # the newest, as at the origin
        copy = client.get_artifact(run.artifact.artifact_id)
        assert copy == source.get_artifact(run.artifact.artifact_id)
        assert b"".join(client.read(copy.artifact_id)[1]) == BLOB
        assert list(client.list_snapshots("run-1")) == run.snapshots


def test_only_an_admin_of_the_run_s_fleet_imports(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    agent = target.client_for(agent="scout-1")
    for call, args in ((agent.import_run, (run.run,)),
                       (agent.import_artifact, (run.artifact, [BLOB]))):
        assert refused(call, *args).code == grpc.StatusCode.PERMISSION_DENIED
    error = refused(agent.import_run_items, events=run.events)
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    with admin_of(target, make_token, "fleet-b") as other:
        error = refused(other.import_run, run.run)
        assert (error.code, error.reason) == (grpc.StatusCode.PERMISSION_DENIED,
                                              "FLEET_MISMATCH")
        # The artifact's key names fleet-a: fleet-b's admin cannot write it there.
        error = refused(other.import_artifact, run.artifact, [BLOB])
        assert error.reason == "INVALID_ARTIFACT_PATH"
    with admin_of(target, make_token) as client:
        assert not list(client.list_runs())
    assert not list((target.blob_root).rglob("out.txt"))


def test_altered_items_are_refused_by_name_and_nothing_of_the_call_is_stored(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        client.import_artifact(run.artifact, [BLOB])

        def altered(message: pb.Event | pb.Snapshot | pb.Manifest | pb.Evidence,
                    **fields: object) -> object:
            copy = type(message)()
            copy.CopyFrom(message)
            for name, value in fields.items():
                setattr(copy, name, value)
            return copy

        cases = [
            ({"events": [run.events[0], altered(run.events[1], payload_json='{"ok":false}')]},
             grpc.StatusCode.INVALID_ARGUMENT, "EVENT_HASH_MISMATCH"),
            ({"events": [altered(run.events[0], payload_json='{ "tool": "search" }')]},
             grpc.StatusCode.INVALID_ARGUMENT, "NOT_CANONICAL"),
            ({"manifests": [altered(run.manifests[0], content_json='{"files":[]}')]},
             grpc.StatusCode.INVALID_ARGUMENT, "MANIFEST_HASH_MISMATCH"),
            ({"evidence": [altered(run.evidence[0], chunk_id="chunk-8")]},
             grpc.StatusCode.INVALID_ARGUMENT, "EVIDENCE_ID_MISMATCH"),
            ({"snapshots": [altered(run.snapshots[0], state_json='{"step":3}')]},
             grpc.StatusCode.INVALID_ARGUMENT, "SNAPSHOT_HASH_MISMATCH"),
            # The first event left out: the second does not extend an empty chain.
            ({"manifests": run.manifests, "events": run.events[1:]},
             grpc.StatusCode.FAILED_PRECONDITION, "EVENT_CHAIN_GAP"),
            ({"manifests": run.manifests, "events": run.events[:1], "snapshots": run.snapshots},
             grpc.StatusCode.FAILED_PRECONDITION, "SNAPSHOT_AHEAD_OF_LOG"),
            # Its manifest not imported first.
            ({"events": run.events}, grpc.StatusCode.NOT_FOUND, "MANIFEST_NOT_FOUND"),
            ({}, grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_BATCH"),
            ({"events": [run.events[0]] * 1001}, grpc.StatusCode.INVALID_ARGUMENT,
             "BATCH_TOO_LARGE"),
        ]
        for items, code, reason in cases:
            error = refused(client.import_run_items, **items)
            assert (error.code, error.reason) == (code, reason), (reason, error.message)
        assert client.get_run("run-1").event_count == 0
        assert not list(client.list_events("run-1"))
        assert refused(client.get_manifest, run.manifests[0].manifest_id).code == \
            grpc.StatusCode.NOT_FOUND
        assert not list(client.list_snapshots("run-1"))


def test_another_chain_under_a_stored_run_is_a_conflict(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    """A forged event with a hash that recomputes, at a seq already stored, is refused: a
    stored chain is never rewritten."""
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        imported(client, run)
        first = run.events[0]
        forged = pb.Event()
        forged.CopyFrom(first)
        forged.payload_json = '{"tool":"rm -rf"}'
        forged.hash = event_hash(prev_hash="", run_id="run-1", seq=1, type=first.type,
                                 payload_json=forged.payload_json, manifest_id=first.manifest_id,
                                 artifact_ids=tuple(first.artifact_ids), agent_id=first.agent_id,
                                 created_us=first.create_time.ToMicroseconds())
        error = refused(client.import_run_items, events=[forged])
        assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "EVENT_CONFLICT")
        other = pb.Run()
        other.CopyFrom(run.run)
        other.stop_reason = "another"
        error = refused(client.import_run, other)
        assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "RUN_CONFLICT")
        assert list(client.replay("run-1")) == run.events


def test_an_artifact_whose_bytes_differ_is_refused_and_leaves_no_blob(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        error = refused(client.import_artifact, run.artifact, [BLOB[:-1] + b"X"])
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                              "UPLOAD_HASH_MISMATCH")
        error = refused(client.import_artifact, run.artifact, [BLOB[:100]])
        assert error.reason in ("UPLOAD_TRUNCATED", "UPLOAD_HASH_MISMATCH")
        escaping = pb.Artifact()
        escaping.CopyFrom(run.artifact)
        escaping.path = escaping.path.replace("notes/out.txt", "../../../../escape.txt")
        error = refused(client.import_artifact, escaping, [BLOB])
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused(client.get_artifact, run.artifact.artifact_id).code == \
            grpc.StatusCode.NOT_FOUND
        assert not [p for p in target.blob_root.rglob("*") if p.is_file()]
        assert client.import_artifact(run.artifact, [BLOB]).created


def test_an_erased_run_is_not_brought_back(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with target.service.db.session() as session:
        session.add(RunTombstoneRow(fleet_id="fleet-a", run_id="run-1", agent_id="scout-1",
                                    created_us=1, event_count=3, head_hash="0" * 64,
                                    erasure_id="er-1", erased_us=2, erased_by="gov"))
    with admin_of(target, make_token) as client:
        error = refused(client.import_run, run.run)
        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION,
                                              "RUN_ERASED")
        error = refused(client.import_run_items, events=run.events[:1])
        assert error.code == grpc.StatusCode.NOT_FOUND


def test_bad_run_fields_are_refused(pair: tuple[RunningArtifacts, RunningArtifacts],
                                    make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        for change, reason in (
                (lambda r: r.ClearField("stop_time"), "INVALID_RUN"),
                (lambda r: r.ClearField("create_time"), "INVALID_CREATE_TIME"),
                (lambda r: setattr(r, "metadata_json", '{"goal": "move"}'), "NOT_CANONICAL"),
                (lambda r: setattr(r, "run_id", "../run"), "INVALID_IDENTIFIER"),
                (lambda r: setattr(r, "status", 99), "INVALID_RUN")):
            bad = pb.Run()
            bad.CopyFrom(run.run)
            change(bad)
            error = refused(client.import_run, bad)
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
        assert not list(client.list_runs())
    assert json.loads(run.run.metadata_json) == {"goal": "move"}
    assert hashlib.sha256(BLOB).hexdigest() == run.artifact.hash
