"""Seed 004 "How to verify" and the issue's faults, over real gRPC, on SQLite and Postgres."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import inspect, select, text, update

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client._errors import EngramRpcError
from services.artifacts.tables import (
    ArtifactRow,
    EventRow,
    EvidenceRow,
    ManifestRow,
    SnapshotRow,
)
from services.common.blobstore import BlobInfo, BlobStore
from services.common.errors import InvalidArgument
from tests.integration.artifacts.conftest import RunningArtifacts
from tests.scans import Held, third_scan_is_busy


def _chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _start(env: RunningArtifacts, run_id: str = "run-1") -> str:
    return env.client.start_run(run_id).run.run_id


def _no_blobs(env: RunningArtifacts) -> bool:
    return list(env.service.blobs.list()) == []


def _artifact_rows(env: RunningArtifacts) -> int:
    with env.service.db.session() as session:
        return len(session.scalars(select(ArtifactRow)).all())


# -- How to verify -----------------------------------------------------------

def test_store_artifact_metadata_hash_matches_and_db_holds_no_blob(
        artifacts_server: RunningArtifacts, tmp_path: Path) -> None:
    env = artifacts_server
    run_id = _start(env)
    data = os.urandom(3 * 1024 * 1024 + 5)
    source = tmp_path / "report.bin"
    source.write_bytes(data)
    stored = env.client.upload_file(source, run_id=run_id, step_id="step-1",
                                    mime_type="application/pdf", metadata={"tool": "scraper"})
    expected = hashlib.sha256(data).hexdigest()
    assert stored.hash == expected
    assert stored.size_bytes == len(data)
    assert stored.path == f"fleets/fleet-a/runs/{run_id}/step-1/{stored.artifact_id}/report.bin"
    fetched = env.client.get_artifact(stored.artifact_id)
    assert (fetched.hash, fetched.path, fetched.mime_type) == (expected, stored.path,
                                                               "application/pdf")
    assert json.loads(fetched.metadata_json) == {"tool": "scraper"}
    copy = tmp_path / "copy.bin"
    env.client.download(stored.artifact_id, copy)
    assert copy.read_bytes() == data
    with env.service.db.session() as session:
        row = session.get(ArtifactRow, stored.artifact_id)
        assert row is not None
        widths = [len(str(getattr(row, c))) for c in ("artifact_id", "run_id", "step_id",
                                                      "path", "hash", "mime_type", "metadata_")]
        assert sum(widths) < 64 * 1024
    assert (env.blob_root / stored.path).read_bytes() == data


def test_schema_single_artifacts_table_with_seed_indexes(
        artifacts_server: RunningArtifacts) -> None:
    inspector = inspect(artifacts_server.service.db.engine)
    columns = {c["name"] for c in inspector.get_columns("artifacts")}
    assert columns == {"artifact_id", "fleet_id", "run_id", "step_id", "name", "path", "hash",
                       "mime_type", "size_bytes", "created_at", "metadata"}
    assert inspector.get_pk_constraint("artifacts")["constrained_columns"] == ["artifact_id"]
    indexed = {tuple(i["column_names"]) for i in inspector.get_indexes("artifacts")}
    assert ("fleet_id", "run_id", "step_id") in indexed
    assert ("hash",) in indexed
    tables = [t for t in inspector.get_table_names() if not t.startswith("alembic_version")]
    assert [t for t in tables if "artifact" in t] == ["artifacts"]


def test_missing_critical_pointer_retries_once_then_stops_run_with_system_error(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    art = env.client.upload(iter([b"evidence slice"]), run_id=run_id, step_id="s",
                            name="slice.txt")
    (env.blob_root / art.path).unlink()
    with pytest.raises(EngramRpcError) as caught:
        env.client.resolve(run_id, "artifact", art.artifact_id, critical=True)
    error = caught.value
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert error.reason == "CRITICAL_POINTER_UNRESOLVED"
    assert error.metadata["attempts"] == "2"
    assert error.metadata["run_status"] == "SYSTEM_ERROR"
    run = env.client.get_run(run_id)
    assert run.status == pb.RUN_STATUS_SYSTEM_ERROR
    last = list(env.client.list_events(run_id))[-1]
    assert last.type == "run.stopped"
    payload = json.loads(last.payload_json)
    assert payload["status"] == "SYSTEM_ERROR"
    assert payload["pointer"] == {"type": "artifact", "id": art.artifact_id, "path": art.path,
                                  "hash": art.hash}
    with pytest.raises(EngramRpcError) as refused:
        env.client.append_event(run_id, "tool.called", {"n": 1})
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_missing_non_critical_pointer_is_skipped_and_run_goes_on(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    reply = env.client.resolve(run_id, "manifest", "mf_missing", critical=False)
    assert (reply.resolved, reply.attempts) == (False, 1)
    assert env.client.get_run(run_id).status == pb.RUN_STATUS_RUNNING


def test_missing_manifest_and_evidence_pointers_stop_the_run(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    for kind in ("manifest", "evidence"):
        run_id = _start(env, f"run-{kind}")
        with pytest.raises(EngramRpcError) as caught:
            env.client.resolve(run_id, kind, f"{kind}-gone", critical=True)
        assert caught.value.metadata["pointer_type"] == kind
        assert env.client.get_run(run_id).status == pb.RUN_STATUS_SYSTEM_ERROR


def test_manifest_inline_referenced_from_events_and_snapshots(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    content = {"window": ["doc-1#c3", "doc-2#c1"], "why": "top-2 by recall"}
    created = env.client.create_manifest(content, run_id=run_id)
    assert created.created
    again = env.client.create_manifest(content, run_id=run_id)
    assert (again.created, again.manifest.manifest_id) == (False, created.manifest.manifest_id)
    manifest_id = created.manifest.manifest_id
    assert json.loads(env.client.get_manifest(manifest_id).content_json) == content
    event = env.client.append_event(run_id, "context.built", {"k": 1},
                                    manifest_id=manifest_id).event
    assert event.manifest_id == manifest_id
    snapshot = env.client.create_snapshot(run_id, {"step": 1}, manifest_id=manifest_id)
    assert snapshot.manifest_id == manifest_id
    view = env.client.rehydrate(run_id)
    assert view.manifest.manifest_id == manifest_id
    assert json.loads(view.manifest.content_json) == content
    with pytest.raises(EngramRpcError) as caught:
        env.client.append_event(run_id, "context.built", {}, manifest_id="mf_unknown")
    assert caught.value.code == grpc.StatusCode.NOT_FOUND


# -- event log, snapshots, rehydrate ----------------------------------------

def test_event_log_is_sequenced_hash_chained_and_replayable(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    events = [env.client.append_event(run_id, "step", {"i": i}).event for i in range(5)]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(events))
    assert [e.hash for e in env.client.replay(run_id)] == [e.hash for e in events]
    retry = env.client.append_event(run_id, "step", {"i": 9}, request_id="req-1")
    repeat = env.client.append_event(run_id, "step", {"i": 9}, request_id="req-1")
    assert (retry.created, repeat.created) == (True, False)
    assert repeat.event.seq == retry.event.seq == 6
    page = list(env.client.list_events(run_id, after_seq=2, page_size=2))
    assert [e.seq for e in page] == [3, 4, 5, 6]


def test_tampered_event_breaks_replay_with_data_loss(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    for i in range(3):
        env.client.append_event(run_id, "step", {"i": i})
    with env.service.db.session() as session:
        session.execute(update(EventRow).where(EventRow.run_id == run_id, EventRow.seq == 2)
                        .values(payload_json='{"i":42}'))
    with pytest.raises(EngramRpcError) as caught:
        list(env.client.replay(run_id))
    assert caught.value.code == grpc.StatusCode.DATA_LOSS
    assert caught.value.reason == "EVENT_CHAIN_BROKEN"


def test_rehydrate_is_latest_snapshot_plus_events_since(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    empty = env.client.rehydrate(run_id)
    assert not empty.HasField("snapshot") and list(empty.events) == []
    for i in range(4):
        env.client.append_event(run_id, "step", {"i": i})
    first = env.client.create_snapshot(run_id, {"upto": 4})
    assert first.seq == 4
    for i in range(4, 7):
        env.client.append_event(run_id, "step", {"i": i})
    second = env.client.create_snapshot(run_id, {"upto": 6}, seq=6)
    env.client.append_event(run_id, "step", {"i": 7})
    assert env.client.latest_snapshot(run_id).snapshot_id == second.snapshot_id
    assert [s.snapshot_id for s in env.client.list_snapshots(run_id)] == [
        first.snapshot_id, second.snapshot_id]
    view = env.client.rehydrate(run_id)
    assert view.snapshot.snapshot_id == second.snapshot_id
    assert json.loads(view.snapshot.state_json) == {"upto": 6}
    assert [e.seq for e in view.events] == [7, 8]
    assert view.run.event_count == 8
    with pytest.raises(EngramRpcError) as ahead:
        env.client.create_snapshot(run_id, {}, seq=99)
    assert ahead.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_rehydrate_returns_events_within_its_byte_budget_and_says_more_follow(
        artifacts_server: RunningArtifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review (2026-11-29): Rehydrate read every event after the snapshot at once,
    however large: 1,150 events of 61 KB made a reply over gRPC's 64 MiB (RESOURCE_EXHAUSTED
    for the run, whatever the caller asked) after 341 MiB of memory. Here the budget is 1 MiB
    (REHYDRATE_BYTES, 16 MiB in service) and the page 7 events, so pages and budget both show."""
    from services.artifacts import service as service_module

    monkeypatch.setattr(service_module, "REHYDRATE_BYTES", 1024 * 1024)
    monkeypatch.setattr(service_module, "REHYDRATE_PAGE", 7)
    env = artifacts_server
    run_id = _start(env)
    blob = "y" * 50_000
    for i in range(40):  # 2 MB of payloads
        env.client.append_event(run_id, "step", {"i": i, "blob": blob})
    view = env.client.rehydrate(run_id)
    assert view.truncated and 15 <= len(view.events) <= 21, len(view.events)
    assert [e.seq for e in view.events] == list(range(1, len(view.events) + 1))
    assert sum(len(e.payload_json) for e in view.events) <= 1024 * 1024
    rest = list(env.client.list_events(run_id, after_seq=view.events[-1].seq))
    assert [e.seq for e in rest] == list(range(len(view.events) + 1, 41))
    few = env.client.rehydrate(run_id, max_events=3)
    assert few.truncated and [e.seq for e in few.events] == [1, 2, 3]
    env.client.create_snapshot(run_id, {"upto": 38}, seq=38)
    tail = env.client.rehydrate(run_id)
    assert not tail.truncated and [e.seq for e in tail.events] == [39, 40]
    exact = env.client.rehydrate(run_id, max_events=2)
    assert not exact.truncated and [e.seq for e in exact.events] == [39, 40]


def test_a_request_id_sent_again_with_another_body_is_refused(
        artifacts_server: RunningArtifacts) -> None:
    """Found by a review (2026-11-29): AppendEvent and CreateSnapshot answered a reused
    request_id with the first call's result and dropped the new body without a word (the shard
    and the compactor refuse it REQUEST_ID_REUSED)."""
    env = artifacts_server
    run_id = _start(env)
    first = env.client.append_event(run_id, "tool.called", {"cmd": "ls"}, request_id="e-1")
    again = env.client.append_event(run_id, "tool.called", {"cmd": "ls"}, request_id="e-1")
    assert (again.event.seq, again.created) == (first.event.seq, False)  # a retry
    for kind, payload in (("tool.called", {"cmd": "rm -rf /"}), ("other", {"cmd": "ls"})):
        with pytest.raises(EngramRpcError) as reused:
            env.client.append_event(run_id, kind, payload, request_id="e-1")
        assert (reused.value.code, reused.value.reason) == (grpc.StatusCode.ALREADY_EXISTS,
                                                            "REQUEST_ID_REUSED")
    snapshot = env.client.create_snapshot(run_id, {"state": "A"}, request_id="s-1")
    env.client.append_event(run_id, "step", {"i": 2})
    # a retry (seq 0: the head when it first ran) gets the first snapshot back
    assert env.client.create_snapshot(run_id, {"state": "A"},
                                      request_id="s-1").snapshot_id == snapshot.snapshot_id
    for state, seq in (({"state": "B"}, 0), ({"state": "A"}, 2)):
        with pytest.raises(EngramRpcError) as reused:
            env.client.create_snapshot(run_id, state, seq=seq, request_id="s-1")
        assert reused.value.reason == "REQUEST_ID_REUSED"
    assert env.client.get_run(run_id).event_count == 2
    assert [s.snapshot_id for s in env.client.list_snapshots(run_id)] == [snapshot.snapshot_id]


def test_rehydrate_stops_run_when_snapshot_artifact_is_gone(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    art = env.client.upload(iter([b"state blob"]), run_id=run_id, step_id="s", name="state")
    env.client.create_snapshot(run_id, {"ref": art.artifact_id}, artifact_ids=[art.artifact_id])
    (env.blob_root / art.path).unlink()
    with pytest.raises(EngramRpcError) as caught:
        env.client.rehydrate(run_id)
    assert caught.value.reason == "CRITICAL_POINTER_UNRESOLVED"
    assert env.client.get_run(run_id).status == pb.RUN_STATUS_SYSTEM_ERROR


# -- evidence ----------------------------------------------------------------

def test_evidence_ids_are_deterministic_and_namespaced(
        artifacts_server: RunningArtifacts) -> None:
    client = artifacts_server.client
    first = client.create_evidence("corpus-a", "idx-1", "chunk-7", 10, 42)
    again = client.create_evidence("corpus-a", "idx-1", "chunk-7", 10, 42)
    other = client.create_evidence("corpus-b", "idx-1", "chunk-7", 10, 42)
    assert first.created and not again.created
    assert first.evidence.evidence_id == again.evidence.evidence_id
    assert other.evidence.evidence_id != first.evidence.evidence_id
    got = client.get_evidence(first.evidence.evidence_id)
    assert (got.chunk_id, got.span.start, got.span.end) == ("chunk-7", 10, 42)
    with pytest.raises(EngramRpcError) as bad:
        client.create_evidence("corpus-a", "idx-1", "chunk-7", 50, 10)
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT


# -- bad input and faults -----------------------------------------------------

def test_oversized_metadata_is_refused_with_nothing_stored(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    with pytest.raises(EngramRpcError) as caught:
        env.client.upload(iter([b"x" * 10]), run_id=run_id, step_id="s", name="a",
                          metadata={"blob": "y" * 70_000})
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "DOCUMENT_TOO_LARGE"
    with pytest.raises(EngramRpcError):
        env.client.append_event(run_id, "big", {"blob": "z" * 70_000})
    assert _no_blobs(env) and _artifact_rows(env) == 0


def test_nan_and_infinity_are_invalid_argument_never_internal(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    client = env.client
    calls: list[Callable[[str], object]] = [
        lambda document: client.append_event(run_id, "step", document),
        lambda document: client.create_snapshot(run_id, document),
        client.create_manifest,
        lambda document: client.upload(iter([b"x"]), run_id=run_id, step_id="s", name="a",
                                       metadata=document),
    ]
    for document in ('{"x": NaN}', '{"x": -Infinity}', '{"big": 1e999}'):
        for call in calls:
            with pytest.raises(EngramRpcError) as caught:
                call(document)
            assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.reason == "INVALID_JSON"
            assert "NaN" in caught.value.message
    assert client.get_run(run_id).event_count == 0
    assert _no_blobs(env) and _artifact_rows(env) == 0


def test_a_lone_surrogate_escape_is_invalid_json_never_internal(
        artifacts_server: RunningArtifacts) -> None:
    """``"\\ud800"`` is valid JSON text (ASCII on the wire) but decodes to no character: its
    canonical form has no UTF-8 bytes to store or hash (was INTERNAL, UnicodeEncodeError)."""
    env = artifacts_server
    run_id = _start(env)
    client = env.client
    calls: dict[str, Callable[[str], object]] = {
        "metadata_json": lambda document: client.start_run("run-s", document),
        "payload_json": lambda document: client.append_event(run_id, "step", document),
        "state_json": lambda document: client.create_snapshot(run_id, document),
        "content_json": client.create_manifest,
        "upload metadata": lambda document: client.upload(
            iter([b"x"]), run_id=run_id, step_id="s", name="a", metadata=document),
        "evidence metadata": lambda document: client.create_evidence(
            "corpus-a", "idx-1", "chunk-1", 0, 1, metadata=document),
    }
    for document in ('{"note": "\\ud800"}', '{"\\udfff": 1}', '{"list": ["ok", "x\\udc00y"]}'):
        for field, call in calls.items():
            with pytest.raises(EngramRpcError) as caught:
                call(document)
            assert (caught.value.code, caught.value.reason) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_JSON"), (field, document)
            assert "lone surrogate" in caught.value.message
    assert [r.run_id for r in client.list_runs()] == [run_id]
    assert client.get_run(run_id).event_count == 0
    assert _no_blobs(env) and _artifact_rows(env) == 0
    with env.service.db.session() as session:
        for table in (SnapshotRow, ManifestRow, EvidenceRow):
            assert session.scalars(select(table)).all() == [], table.__tablename__
    # a surrogate pair is one character (U+1F600), stored as such
    paired = client.append_event(run_id, "step", '{"note": "\\ud83d\\ude00"}').event
    assert json.loads(paired.payload_json) == {"note": "\U0001F600"}


@pytest.mark.parametrize("name", ["../escape", "a/../../b", "/etc/passwd", "a//b"])
def test_traversal_names_are_refused(artifacts_server: RunningArtifacts, name: str) -> None:
    env = artifacts_server
    run_id = _start(env)
    with pytest.raises(EngramRpcError) as caught:
        env.client.upload(iter([b"x"]), run_id=run_id, step_id="s", name=name)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert _no_blobs(env) and _artifact_rows(env) == 0


@pytest.mark.parametrize("name", ["a" * 256, "\u00e9" * 200, "ok/" + "b" * 300,
                                  "\u00e9" * 300, "note\r.txt", "zzz\x01.txt", "tab\there",
                                  "del\x7f", "nel\u0085"])
def test_a_name_no_store_can_hold_is_refused_and_leaves_nothing(
        artifacts_server: RunningArtifacts, name: str) -> None:
    """Found by a review (2026-11-29): a part over 255 bytes failed at the store's link,
    INTERNAL after the whole upload, and left the directories it had made. And (2026-11-30) a
    control character, which S3's XML listings cannot carry: an erasure left such a blob."""
    env = artifacts_server
    run_id = _start(env)
    with pytest.raises(EngramRpcError) as caught:
        env.client.upload(iter([b"x"]), run_id=run_id, step_id="s", name=name)
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                        "INVALID_ARTIFACT_NAME")
    assert _artifact_rows(env) == 0
    left = [p for p in env.blob_root.rglob("*") if p.name != ".tmp"]  # the spool directory
    assert left == [], "files or directories left"


def test_unknown_run_and_stopped_run_are_refused(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    with pytest.raises(EngramRpcError) as unknown:
        env.client.upload(iter([b"x"]), run_id="nope", step_id="s", name="a")
    assert unknown.value.code == grpc.StatusCode.NOT_FOUND
    run_id = _start(env)
    stopped = env.client.stop_run(run_id, "succeeded", "done")
    assert stopped.status == pb.RUN_STATUS_SUCCEEDED
    with pytest.raises(EngramRpcError) as after_stop:
        env.client.upload(iter([b"x"]), run_id=run_id, step_id="s", name="a")
    assert after_stop.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert after_stop.value.reason == "RUN_STOPPED"
    assert _no_blobs(env) and _artifact_rows(env) == 0


def test_short_upload_against_declared_size_leaves_nothing(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    with pytest.raises(EngramRpcError) as caught:
        env.client.upload(iter([b"x" * 100]), run_id=run_id, step_id="s", name="a",
                          size_bytes=1000)
    assert caught.value.reason == "UPLOAD_TRUNCATED"
    assert _no_blobs(env) and _artifact_rows(env) == 0


class ObservedStore(BlobStore):
    """The server's real store, reporting when a put has bytes in hand and how it ended."""

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner
        self.receiving = threading.Event()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def put(self, key: str, chunks: Iterable[bytes],
            before_commit: Callable[[BlobInfo], None] | None = None) -> BlobInfo:
        def observed() -> Iterator[bytes]:
            for chunk in chunks:
                self.receiving.set()
                yield chunk

        try:
            return self.inner.put(key, observed(), before_commit)
        except BaseException as error:
            self.error = error
            raise
        finally:
            self.finished.set()

    def open(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return self.inner.open(key, chunk_size)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        return self.inner.list(prefix)


def test_client_vanishing_mid_upload_leaves_no_partial_artifact(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    store = ObservedStore(env.service.blobs)
    env.service.blobs = store
    client = env.client
    release = threading.Event()

    def requests() -> Iterator[pb.CreateArtifactRequest]:
        yield pb.CreateArtifactRequest(header=pb.ArtifactHeader(run_id=run_id, step_id="s",
                                                                name="cut"))
        for _ in range(8):
            yield pb.CreateArtifactRequest(chunk=os.urandom(256 * 1024))
        release.wait(30)

    future = client.stub.CreateArtifact.future(requests(), metadata=client.metadata)
    assert store.receiving.wait(30), "the server never started receiving the upload"
    future.cancel()
    release.set()
    assert store.finished.wait(30), "the server's put never ended after the cancel"
    # Which of the two depends on the order grpc sees the cancel and the empty read in.
    assert isinstance(store.error, InvalidArgument)
    assert store.error.reason in {"UPLOAD_ABORTED", "UPLOAD_TRUNCATED"}
    assert not any((env.blob_root / ".tmp").iterdir())
    assert _no_blobs(env) and _artifact_rows(env) == 0


@pytest.mark.parametrize("trailer", [None, pb.ArtifactTrailer(size_bytes=1 << 20),
                                     pb.ArtifactTrailer(size_bytes=3, sha256="0" * 64)])
def test_upload_without_a_matching_trailer_is_refused(
        artifacts_server: RunningArtifacts, trailer: pb.ArtifactTrailer | None) -> None:
    """A stream that ends cleanly without its trailer is what a cancel can look like."""
    env = artifacts_server
    run_id = _start(env)
    messages = [pb.CreateArtifactRequest(header=pb.ArtifactHeader(run_id=run_id, step_id="s",
                                                                  name="short")),
                pb.CreateArtifactRequest(chunk=b"abc")]
    if trailer is not None:
        messages.append(pb.CreateArtifactRequest(trailer=trailer))
    with pytest.raises(grpc.RpcError) as caught:
        env.client.stub.CreateArtifact(iter(messages), metadata=env.client.metadata)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    expected = "UPLOAD_HASH_MISMATCH" if trailer is not None and trailer.sha256 else \
        "UPLOAD_TRUNCATED"
    assert EngramRpcError.from_rpc_error(caught.value).reason == expected
    assert _no_blobs(env) and _artifact_rows(env) == 0


def test_duplicate_path_is_already_exists(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    env.client.upload(iter([b"one"]), run_id=run_id, step_id="s", name="a")
    with pytest.raises(EngramRpcError) as caught:
        env.client.upload(iter([b"two"]), run_id=run_id, step_id="s", name="a")
    assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert _artifact_rows(env) == 1


def test_the_same_bytes_again_under_the_same_name_get_the_first_artifact(
        artifacts_server: RunningArtifacts) -> None:
    """A retried upload whose reply was lost (fault test 7): the first result, nothing twice;
    with a declared hash that differs it is refused before the bytes are read."""
    env = artifacts_server
    run_id = _start(env)
    first = env.client.upload(iter([b"one", b"two"]), run_id=run_id, step_id="s", name="a")
    again = env.client.upload(iter([b"on", b"etwo"]), run_id=run_id, step_id="s", name="a")
    assert again == first
    with pytest.raises(EngramRpcError) as caught:
        env.client.upload(iter([b"onetwo"]), run_id=run_id, step_id="s", name="a",
                          sha256="0" * 64)
    assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert _artifact_rows(env) == 1


def test_blob_altered_or_deleted_behind_the_service_is_found_on_read_and_verify(
        artifacts_server: RunningArtifacts, tmp_path: Path) -> None:
    env = artifacts_server
    run_id = _start(env)
    altered = env.client.upload(_chunks(os.urandom(200_000)), run_id=run_id, step_id="s",
                                name="altered")
    deleted = env.client.upload(iter([b"bye"]), run_id=run_id, step_id="s", name="deleted")
    intact = env.client.upload(iter([b"ok"]), run_id=run_id, step_id="s", name="intact")
    target = env.blob_root / altered.path
    raw = bytearray(target.read_bytes())
    raw[1000] ^= 0xFF
    target.write_bytes(bytes(raw))
    (env.blob_root / deleted.path).unlink()

    destination = tmp_path / "out"
    with pytest.raises(EngramRpcError) as bad_hash:
        env.client.download(altered.artifact_id, destination)
    assert bad_hash.value.code == grpc.StatusCode.DATA_LOSS
    assert bad_hash.value.reason == "BLOB_HASH_MISMATCH"
    assert not destination.exists()
    with pytest.raises(EngramRpcError) as gone:
        env.client.download(deleted.artifact_id, destination)
    assert (gone.value.code, gone.value.reason) == (grpc.StatusCode.DATA_LOSS, "BLOB_MISSING")

    report = env.client.verify(run_id)
    assert report.checked == 3
    problems = {p.artifact_id: p.problem for p in report.problems}
    assert problems == {altered.artifact_id: "BLOB_HASH_MISMATCH",
                        deleted.artifact_id: "BLOB_MISSING"}
    env.client.download(intact.artifact_id, destination)
    assert destination.read_bytes() == b"ok"


def test_fleets_do_not_see_each_other(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    art = env.client.upload(iter([b"secret"]), run_id=run_id, step_id="s", name="a")
    outsider = env.client_for(fleet="fleet-b")
    for call in (lambda: outsider.get_run(run_id),
                 lambda: outsider.get_artifact(art.artifact_id),
                 lambda: outsider.append_event(run_id, "x", {})):
        with pytest.raises(EngramRpcError) as caught:
            call()
        assert caught.value.code == grpc.StatusCode.NOT_FOUND


def test_list_artifacts_pages_by_step(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = _start(env)
    ids = [env.client.upload(iter([f"{i}".encode()]), run_id=run_id, step_id=f"s{i % 2}",
                             name=f"f{i}").artifact_id for i in range(5)]
    assert [a.artifact_id for a in env.client.list_artifacts(run_id, page_size=2)] == ids
    assert [a.artifact_id for a in env.client.list_artifacts(run_id, "s1")] == ids[1::2]
    with env.service.db.session() as session:
        assert session.execute(text("SELECT COUNT(*) FROM artifacts")).scalar_one() == 5


def test_a_full_last_page_carries_no_token(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    client = env.client
    run_id = _start(env)
    ids = [client.upload(iter([b"x"]), run_id=run_id, step_id="s", name=f"f{i}").artifact_id
           for i in range(4)]
    for i in range(4):
        client.append_event(run_id, "step", {"i": i})
    first = client.call(client.stub.ListArtifacts,
                        pb.ListArtifactsRequest(run_id=run_id, page_size=2))
    second = client.call(client.stub.ListArtifacts, pb.ListArtifactsRequest(
        run_id=run_id, page_size=2, page_token=first.next_page_token))
    assert [a.artifact_id for a in [*first.artifacts, *second.artifacts]] == ids
    assert first.next_page_token and not second.next_page_token
    events = client.call(client.stub.ListEvents,
                         pb.ListEventsRequest(run_id=run_id, page_size=4))
    assert [e.seq for e in events.events] == [1, 2, 3, 4] and not events.next_page_token
    runs = client.call(client.stub.ListRuns, pb.ListRunsRequest(page_size=1))
    assert [r.run_id for r in runs.runs] == [run_id] and not runs.next_page_token


def test_whole_fleet_verifies_take_a_scan_slot_and_stop_when_their_caller_goes(
        artifacts_server: RunningArtifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review (2026-11-30): VerifyArtifacts of a whole fleet re-hashes every blob, as
    many at once as callers liked (128 held every worker for minutes) and on after its caller
    had gone. Now two at once on a replica, a third SCAN_BUSY; a run's verify takes no slot;
    a verify stops between blobs once its caller has gone."""
    env = artifacts_server
    run_id = _start(env)
    for n in range(3):
        env.client.upload(iter([f"blob {n}".encode()]), run_id=run_id, step_id="s",
                          name=f"b{n}.txt")
    held = Held()
    checks: list[str] = []
    check = held.wrap(env.service._check_blob)

    def counted(fleet_id: str, artifact: object) -> object:
        checks.append(fleet_id)
        return check(fleet_id, artifact)

    monkeypatch.setattr(env.service, "_check_blob", counted)
    answers = third_scan_is_busy(held, lambda: env.client.verify().checked, env.client.verify)
    assert answers == [3, 3]

    held.released.clear()
    checks.clear()
    impatient = env.client_for()
    impatient.stream_timeout = 0.5
    with pytest.raises(EngramRpcError) as late:
        impatient.verify()
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(0.5)  # the server's side of the call ends too
    held.release()  # the first blob's check ends after its caller has gone
    time.sleep(1.0)
    assert len(checks) == 1, f"{len(checks)} blobs checked for a caller that had gone"


def test_a_page_of_large_events_or_snapshots_stops_at_its_byte_budget(
        artifacts_server: RunningArtifacts) -> None:
    """Found by review (2026-11-30): pages were sized by count alone, and 1,000 events or
    snapshots at the document limit with their references made a reply past gRPC's 64 MiB
    (`engram bundle export` asks for pages of 1,000). A page now also stops at 16 MiB."""
    env = artifacts_server
    run_id = _start(env)
    document = {"blob": "x" * 60_000}
    for _ in range(300):  # 18 MB in all
        env.client.append_event(run_id, "tool.called", document)
        env.client.create_snapshot(run_id, document)
    events = env.client.call(env.client.stub.ListEvents,
                             pb.ListEventsRequest(run_id=run_id, page_size=1000))
    snapshots = env.client.call(env.client.stub.ListSnapshots,
                                pb.ListSnapshotsRequest(run_id=run_id, page_size=1000))
    for page, items in ((events, events.events), (snapshots, snapshots.snapshots)):
        assert 200 < len(items) < 300 and page.next_page_token
    assert len(list(env.client.list_events(run_id, page_size=1000))) == 300
    assert len(list(env.client.list_snapshots(run_id, page_size=1000))) == 300


def test_every_part_of_a_verify_stops_once_its_caller_has_gone(
        artifacts_server: RunningArtifacts) -> None:
    """A review found only the blobs' re-hashing checked for its caller: snapshots, manifests
    and tombstones were walked on, holding the scan slot."""
    from services.common.errors import Aborted

    env = artifacts_server
    run_id = _start(env)
    env.client.create_snapshot(run_id, {"state": 1})
    env.client.create_manifest({"files": ["a"]}, run_id=run_id)
    env.client.upload(iter([b"x"]), run_id=run_id, step_id="s", name="a.txt")

    def gone() -> bool:
        return False

    for check in (lambda: env.service.verify("fleet-a", "", gone),
                  lambda: env.service.verify_snapshots("fleet-a", "", gone),
                  lambda: env.service.verify_manifests("fleet-a", "", gone)):
        with pytest.raises(Aborted) as stopped:
            check()
        assert stopped.value.reason == "SCAN_ABANDONED"


def test_a_runs_latest_snapshot_of_another_run_or_gone_is_data_loss(
        artifacts_server: RunningArtifacts) -> None:
    """Found by review (2026-11-30), someone with the disk: a run's latest snapshot pointed at
    another run's was served as this run's state, and one pointed at nothing made Rehydrate
    replay every event as if the run had no snapshot."""
    from services.artifacts.tables import RunRow

    env = artifacts_server
    mine, other = _start(env, "run-mine"), _start(env, "run-other")
    for run in (mine, other):
        env.client.append_event(run, "step", {"run": run})
        env.client.create_snapshot(run, {"state": run})
        env.client.append_event(run, "step", {"after": run})
    theirs = env.client.latest_snapshot(other).snapshot_id
    for pointed in (theirs, "snap_gone"):
        with env.service.db.session() as session:
            session.execute(update(RunRow).where(RunRow.run_id == mine)
                            .values(latest_snapshot_id=pointed))
        for call in (lambda: env.client.rehydrate(mine), lambda: env.client.latest_snapshot(mine)):
            with pytest.raises(EngramRpcError) as caught:
                call()
            assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.DATA_LOSS,
                                                                "SNAPSHOT_MISMATCH")
    assert env.client.rehydrate(other).snapshot.snapshot_id == theirs
