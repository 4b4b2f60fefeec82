"""ImportRun, ImportArtifact and ImportRunItems between two real artifacts servers, on SQLite
and Postgres: a run moves with its ids, authors, times and hash chain and serves the same
(rehydrate, replay, verify); importing twice changes nothing; admin of the same fleet only;
every altered, out-of-order or unbounded input is refused by name with nothing stored."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from services.artifacts.domain.chain import (
    EMPTY_RUN_LEAF,
    event_hash,
    event_hash_v2,
    payload_commitment,
)
from services.artifacts.erasure import RunEraser
from services.artifacts.imports import RunImports
from services.artifacts.servicer import manifest_from_proto
from services.artifacts.tables import ArtifactRow, RunTombstoneRow
from services.common.erasure_source import ErasureOrder
from services.common.errors import Unavailable
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


def _flip(value: str) -> str:
    return value[:5] + ("0" if value[5] != "0" else "1") + value[6:]


def _recommitted(event: pb.Event, payload: str) -> dict[str, object]:
    """Another payload under the event's salt, its commitment made again to match."""
    return {"payload_json": payload, "payload_commitment": payload_commitment(event.salt,
                                                                              payload)}


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
            # Format 2: salt, commitment and hash each bind the payload (salt and commitment
            # travel with it so the target re-checks them).
            *[({"events": [altered(run.events[0], **change)]},
               grpc.StatusCode.INVALID_ARGUMENT, "EVENT_HASH_MISMATCH") for change in (
                {"salt": _flip(run.events[0].salt)},
                {"salt": ""},
                {"payload_commitment": _flip(run.events[0].payload_commitment)},
                {"format": 1},  # as if its hash covered the payload itself
                _recommitted(run.events[0], '{"tool":"rm"}'),  # the hash kept
            )],
            ({"events": [altered(run.events[0], format=3)]},
             grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FORMAT"),
            *[({"snapshots": [altered(run.snapshots[0], **change)]},
               grpc.StatusCode.INVALID_ARGUMENT, "SNAPSHOT_HASH_MISMATCH") for change in (
                {"salt": _flip(run.snapshots[0].salt)},
                {"state_hash": _flip(run.snapshots[0].state_hash)},
                {"format": 1},
            )],
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
        forged.payload_commitment = payload_commitment(first.salt, forged.payload_json)
        forged.hash = event_hash_v2(
            prev_hash="", run_id="run-1", seq=1, type=first.type,
            payload_commitment=forged.payload_commitment, manifest_id=first.manifest_id,
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
        for call, args in ((client.import_run_items, {"events": run.events[:1]}),
                           (client.import_run_items, {"manifests": run.manifests}),
                           (client.import_artifact, {"artifact": run.artifact,
                                                     "chunks": [BLOB]})):
            error = refused(call, **args)
            assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                  "RUN_ERASED"), error.message


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


def _erase(target: RunningArtifacts, run_id: str) -> None:
    """What ForgetRuns does for one run once governance has recorded the erasure."""
    eraser = RunEraser(target.service, None)
    order = ErasureOrder("er-1", "fleet-a", "gov", (("run", run_id, EMPTY_RUN_LEAF),))
    with target.service.writing() as session:  # the run has no events
        eraser._erase_run(session, order, run_id, EMPTY_RUN_LEAF, 2)
    eraser._purge_blobs("fleet-a", [run_id])


def test_a_blob_left_by_a_failed_import_is_adopted_and_an_erasure_sweeps_strays(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An import whose row insert failed after its blob was stored, and whose clean-up failed
    too (the database and the store both failing), left the blob at the artifact's own key:
    every retry was ALREADY_EXISTS BLOB_EXISTS for good, and an erasure of the run left it."""
    origin, target = pair
    run = written(origin)
    repository, blobs = target.service.repository, target.service.blobs

    def database_gone(*args: object, **kwargs: object) -> None:
        raise Unavailable("database unavailable", reason="DATABASE_UNAVAILABLE")

    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        with monkeypatch.context() as patch:
            patch.setattr(repository, "add_artifact", database_gone)
            patch.setattr(blobs, "delete", database_gone)
            assert refused(client.import_artifact, run.artifact, [BLOB]).code == \
                grpc.StatusCode.UNAVAILABLE
        durable: list[str] = []
        make_durable = blobs.make_durable
        monkeypatch.setattr(blobs, "make_durable",
                            lambda key: (durable.append(key), make_durable(key))[1])
        assert client.import_artifact(run.artifact, [BLOB]).created  # the leftover adopted
        # ... and made durable first: the put that left it may have died before its fsyncs
        assert durable == [client.get_artifact(run.artifact.artifact_id).path]
        assert b"".join(client.read(run.artifact.artifact_id)[1]) == BLOB
        stray = "fleets/fleet-a/runs/run-1/plan/art_stray/left.txt"
        blobs.put(stray, [b"an upload that never got its row"])
    _erase(target, "run-1")
    assert not [p for p in target.blob_root.rglob("*") if p.is_file()]


def test_a_leftover_blob_with_other_bytes_is_replaced_on_the_next_attempt(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        path = client.import_artifact(run.artifact, [BLOB]).artifact.path
        with target.service.writing() as session:  # the row gone, other bytes left behind
            session.execute(sqlalchemy.delete(ArtifactRow))
        target.service.blobs.delete(path)
        target.service.blobs.put(path, [b"other bytes"])
        error = refused(client.import_artifact, run.artifact, [BLOB])
        assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "CONCURRENT_WRITE")
        assert client.import_artifact(run.artifact, [BLOB]).created
        assert b"".join(client.read(run.artifact.artifact_id)[1]) == BLOB


def test_an_erasure_racing_an_import_of_the_run_s_manifest_takes_it_too(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On Postgres the import read the run without locking it: an erasure that committed
    while the import's transaction was open left the imported manifest of the erased run."""
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
    repository = target.service.repository
    add_manifest = repository.add_manifest
    eraser = threading.Thread(target=_erase, args=(target, "run-1"))

    def add_while_erasing(session: object, manifest: object) -> None:
        eraser.start()  # it waits for the run this import holds, or (unheld) erases now
        time.sleep(0.5)
        add_manifest(session, manifest)  # type: ignore[arg-type]

    monkeypatch.setattr(repository, "add_manifest", add_while_erasing)
    imports = RunImports(target.service)
    imports.import_items("fleet-a", [manifest_from_proto(run.manifests[0], "fleet-a")], [],
                         [], [])
    eraser.join(10)
    with target.service.db.session() as session:
        assert repository.run_tombstone(session, "fleet-a", "run-1") == "er-1"
        assert repository.get_manifest(session, "fleet-a", run.manifests[0].manifest_id) is None


def test_out_of_range_times_and_long_ids_are_invalid_not_internal(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        far = pb.Run()
        far.CopyFrom(run.run)
        far.create_time.seconds = 2**40
        assert refused(client.import_run, far).reason == "INVALID_CREATE_TIME"
        client.import_run(run.run)
        bad = pb.Event()
        bad.CopyFrom(run.events[0])
        bad.create_time.nanos = -1
        assert refused(client.import_run_items, events=[bad]).reason == "INVALID_CREATE_TIME"
        long_id = pb.Artifact()
        long_id.CopyFrom(run.artifact)
        long_id.artifact_id = "art_" + "a" * 96
        long_id.path = long_id.path.replace(run.artifact.artifact_id, long_id.artifact_id)
        error = refused(client.import_artifact, long_id, [BLOB])
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                              "INVALID_IDENTIFIER")


def test_an_id_another_fleet_holds_is_taken_and_nothing_is_said_of_it(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    origin, target = pair
    run = written(origin)
    with admin_of(target, make_token) as client:
        imported(client, run)
    with admin_of(target, make_token, "fleet-b") as other:
        mine = pb.Run()
        mine.CopyFrom(run.run)
        mine.fleet_id = "fleet-b"
        other.import_run(mine)
        copied = pb.Artifact()
        copied.CopyFrom(run.artifact)
        copied.path = copied.path.replace("fleets/fleet-a/", "fleets/fleet-b/")
        error = refused(other.import_artifact, copied, [BLOB])
        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ID_TAKEN")
        assert "fleet-a" not in error.message
        taken = pb.Snapshot()
        taken.CopyFrom(next(s for s in run.snapshots if not s.artifact_ids))
        taken.seq = 0  # within fleet-b's empty log; the state (and its hash) unchanged
        error = refused(other.import_run_items, snapshots=[taken])
        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ID_TAKEN")
        assert not list(other.list_snapshots("run-1"))
    assert not [p for p in target.blob_root.rglob("*") if "fleet-b" in str(p) and p.is_file()]


def test_format_1_events_and_snapshots_of_an_older_bundle_import_and_verify(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory) -> None:
    """Written before salted commitments (no format field: 0), the chain hashing the payloads
    themselves: imported as format 1, replayed and read as at the origin."""
    _origin, target = pair
    events, head = [], ""
    for seq in (1, 2):
        event = pb.Event(run_id="run-old", seq=seq, type="said", payload_json=f'{{"n":{seq}}}',
                         agent_id="scout-1", prev_hash=head)
        event.create_time.FromMicroseconds(2_000_000 + seq)
        event.hash = head = event_hash(
            prev_hash=head, run_id="run-old", seq=seq, type="said",
            payload_json=event.payload_json, manifest_id="", artifact_ids=(),
            agent_id="scout-1", created_us=2_000_000 + seq)
        events.append(event)
    snapshot = pb.Snapshot(snapshot_id="snap_old", run_id="run-old", seq=2, state_json='{"n":2}',
                           state_hash=hashlib.sha256(b'{"n":2}').hexdigest())
    snapshot.create_time.FromMicroseconds(2_000_003)
    run = pb.Run(run_id="run-old", agent_id="scout-1", status=pb.RUN_STATUS_RUNNING,
                 metadata_json="{}")
    run.create_time.FromMicroseconds(2_000_000)
    with admin_of(target, make_token) as client:
        client.import_run(run)
        salted = pb.Event()
        salted.CopyFrom(events[0])
        salted.salt = "ab" * 32  # a format-1 event carries no salt
        error = refused(client.import_run_items, events=[salted])
        assert error.reason == "EVENT_HASH_MISMATCH"
        assert client.import_run_items(events=events, snapshots=[snapshot]).created == 3
        replayed = list(client.replay("run-old"))
        assert [(e.hash, e.format, e.salt) for e in replayed] == [
            (e.hash, 1, "") for e in events]
        latest = client.latest_snapshot("run-old")
        assert (latest.state_hash, latest.format) == (snapshot.state_hash, 1)
        assert not client.verify("run-old").snapshot_problems
        nxt = client.append_event("run-old", "said", {"n": 3}).event  # the chain goes on
        assert (nxt.prev_hash, nxt.format) == (head, 2)
        assert client.import_run_items(events=replayed).already_present == 2


@pytest.mark.parametrize("other", ["bytes", "metadata"])
def test_a_losing_concurrent_import_of_one_id_leaves_the_winners_bytes(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch, other: str) -> None:
    """Two imports of one artifact id, each finding no row: the first stored and was answered;
    the second, finding the first's blob under its key (other bytes, or the same bytes with
    other metadata), removed it as an earlier import's leftover, and the answered artifact read
    DATA_LOSS BLOB_MISSING (found in review, 2026-11-30)."""
    origin, target = pair
    run = written(origin)
    loser, loser_blob = pb.Artifact(), BLOB
    loser.CopyFrom(run.artifact)
    if other == "bytes":
        loser_blob = BLOB[:-1] + b"X"
        loser.hash = hashlib.sha256(loser_blob).hexdigest()
    else:
        loser.metadata_json = '{"other":true}'
    store = RunImports._store_blob
    checked, winner_done = threading.Event(), threading.Event()

    def held(self: RunImports, *args: Any) -> None:
        if not checked.is_set():  # the first import to get here (the loser's, sent first)
            checked.set()  # past the checks for a row: none yet
            assert winner_done.wait(30)
        store(self, *args)

    monkeypatch.setattr(RunImports, "_store_blob", held)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        second, outcome = _started(lambda: client.import_artifact(loser, [loser_blob]))
        try:
            while not checked.wait(0.05):
                assert second.is_alive(), outcome  # it failed before its store: say how
            assert client.import_artifact(run.artifact, [BLOB]).created
        finally:
            winner_done.set()
            second.join(30)
        assert b"".join(client.read(run.artifact.artifact_id)[1]) == BLOB
        assert list(client.verify(run_id="run-1").problems) == []
        [error] = outcome
        assert error is not None
        assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS,
                                              "ARTIFACT_CONFLICT"), error


def test_an_import_whose_bytes_a_concurrent_one_removed_records_nothing(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The other order: the first import stored its bytes and had not yet inserted its row
    when the second, with other bytes, found no row and removed them. The first must not
    then record an artifact without its blob."""
    origin, target = pair
    run = written(origin)
    other, other_blob = _with_other_bytes(run.artifact)
    store = RunImports._store_blob
    stored, other_done = threading.Event(), threading.Event()

    def held(self: RunImports, *args: Any) -> None:
        store(self, *args)
        if not stored.is_set():  # the first import's bytes are in; its row is not
            stored.set()
            assert other_done.wait(30)

    monkeypatch.setattr(RunImports, "_store_blob", held)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        thread, outcome = _started(lambda: client.import_artifact(run.artifact, [BLOB]))
        try:
            while not stored.wait(0.05):
                assert thread.is_alive(), outcome
            removed = refused(client.import_artifact, other, [other_blob])
            assert (removed.code, removed.reason) == (grpc.StatusCode.ABORTED,
                                                      "CONCURRENT_WRITE")
        finally:
            other_done.set()
            thread.join(30)
        [error] = outcome
        assert error is not None and (error.code, error.reason) == (
            grpc.StatusCode.ABORTED, "CONCURRENT_WRITE"), error
        assert refused(client.get_artifact, run.artifact.artifact_id).code == \
            grpc.StatusCode.NOT_FOUND
        assert client.import_artifact(run.artifact, [BLOB]).created  # sent again: stored
        assert b"".join(client.read(run.artifact.artifact_id)[1]) == BLOB


def test_an_import_whose_bytes_were_replaced_by_a_concurrent_one_records_nothing(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review of the fix above: the first import checked only that a blob was at its
    key. The second, with other bytes, removed the first's, was ABORTED, sent again and put its
    own; the first then found a blob there and recorded its hash over the other's bytes."""
    origin, target = pair
    run = written(origin)
    other, other_blob = _with_other_bytes(run.artifact)
    store = RunImports._store_blob
    stored = {"A": threading.Event(), "B": threading.Event()}
    go = {"A": threading.Event(), "B": threading.Event()}

    calls: list[str] = []

    def held(self: RunImports, fleet_id: str, wanted: Any, *args: Any) -> None:
        calls.append(wanted.hash)
        store(self, fleet_id, wanted, *args)
        # (in the server's threads) A is the first import, B the second of the other bytes
        name = ("A" if wanted.hash == run.artifact.hash else
                "B" if calls.count(other.hash) == 2 else "")
        if name:  # stored, not yet recorded: wait for the test's turn
            stored[name].set()
            assert go[name].wait(30)

    monkeypatch.setattr(RunImports, "_store_blob", held)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        threads = []
        try:
            first, first_outcome = _started(lambda: client.import_artifact(run.artifact, [BLOB]))
            threads.append(first)
            assert stored["A"].wait(30)
            removed = refused(client.import_artifact, other, [other_blob])
            assert removed.reason == "CONCURRENT_WRITE"  # the first's bytes: removed
            second, second_outcome = _started(
                lambda: client.import_artifact(other, [other_blob]))
            threads.append(second)
            assert stored["B"].wait(30)  # the second's bytes now at the key
            go["A"].set()
            first.join(30)
        finally:
            go["A"].set()
            go["B"].set()
            for thread in threads:
                thread.join(30)
        [error] = first_outcome
        assert error is not None and (error.code, error.reason) == (
            grpc.StatusCode.ABORTED, "CONCURRENT_WRITE"), error
        assert second_outcome == [None]
        assert b"".join(client.read(run.artifact.artifact_id)[1]) == other_blob
        assert list(client.verify(run_id="run-1").problems) == []


def _started(call: Callable[[], object]) -> tuple[threading.Thread, list[EngramRpcError | None]]:
    """``call`` in a thread of its own, started; how it ended, once it has (None: answered)."""
    outcome: list[EngramRpcError | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except EngramRpcError as error:
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _with_other_bytes(artifact: pb.Artifact) -> tuple[pb.Artifact, bytes]:
    """``artifact`` with other bytes than BLOB under the same id, and those bytes."""
    other, blob = pb.Artifact(), BLOB[:-1] + b"X"
    other.CopyFrom(artifact)
    other.hash = hashlib.sha256(blob).hexdigest()
    return other, blob


def test_an_import_does_not_read_its_blob_while_it_holds_the_write_lock(
        pair: tuple[RunningArtifacts, RunningArtifacts], make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review of fc0cdb7: the check that the bytes at its key are still its own hashed
    them under the write lock, which on SQLite is every write of the service: an import of a
    5 GiB artifact stalled every fleet's writes while it was read again. It compares the
    store's version of the blob instead."""
    origin, target = pair
    run = written(origin)
    service, blobs = target.service, target.service.blobs
    writing, read = service.writing, blobs.open
    held = threading.local()
    read_under_lock: list[str] = []

    @contextmanager
    def watched() -> Iterator[Any]:
        held.now = True
        try:
            with writing() as session:
                yield session
        finally:
            held.now = False

    def open_watched(key: str, *args: Any) -> Iterator[bytes]:
        if getattr(held, "now", False):
            read_under_lock.append(key)
        return read(key, *args)

    monkeypatch.setattr(service, "writing", watched)
    monkeypatch.setattr(blobs, "open", open_watched)
    with admin_of(target, make_token) as client:
        client.import_run(run.run)
        assert client.import_artifact(run.artifact, [BLOB]).created
        assert b"".join(client.read(run.artifact.artifact_id)[1]) == BLOB
    assert read_under_lock == []
