"""The artifacts service's inputs (finding 10) and retries under races (finding 9), over real
gRPC on SQLite and Postgres: every bad input is INVALID_ARGUMENT naming what to change,
nothing is stored half-way, and concurrent calls of one key all get the first call's answer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from sqlalchemy import func, select

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client._errors import EngramRpcError
from services.artifacts.tables import ArtifactRow, EventRow, RunRow, SnapshotRow
from tests.integration.artifacts.conftest import RunningArtifacts, running_artifacts

T = TypeVar("T")
DEEP = "[" * 5000 + "]" * 5000
THREADS = 16


def _count(env: RunningArtifacts, row: Any) -> int:
    with env.service.db.session() as session:
        return int(session.scalar(select(func.count()).select_from(row)) or 0)


def _refused(call: Callable[[], object], *words: str) -> EngramRpcError:
    with pytest.raises(EngramRpcError) as caught:
        call()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    for word in words:
        assert word in caught.value.message, caught.value.message
    return caught.value


def test_json_nested_5000_deep_is_refused_naming_the_limit(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    client = env.client
    run_id = client.start_run("run-1").run.run_id
    calls: list[Callable[[], object]] = [
        lambda: client.start_run("run-2", metadata={"deep": DEEP}),
        lambda: client.start_run("run-2", metadata='{"deep": ' + DEEP + "}"),
        lambda: client.append_event(run_id, "step", DEEP),
        lambda: client.create_snapshot(run_id, DEEP),
        lambda: client.create_manifest(DEEP),
        lambda: client.create_evidence("c", "i", "k", 0, 1, metadata='{"d": ' + DEEP + "}"),
        lambda: client.upload(iter([b"x"]), run_id=run_id, step_id="s", name="a",
                              metadata='{"d": ' + DEEP + "}"),
    ]
    for call in calls[1:]:
        refusal = _refused(call, "nesting depth", "ENGRAM_LIMITS_JSON_DEPTH")
        assert refusal.reason == "LIMIT_EXCEEDED"
    calls[0]()  # a deep *string* is only text: stored
    assert client.get_run(run_id).event_count == 0
    assert _count(env, SnapshotRow) == 0 and _count(env, ArtifactRow) == 0
    assert list(env.service.blobs.list()) == []


def test_oversized_documents_name_their_setting(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    refusal = _refused(lambda: env.client.append_event(run_id, "big", {"x": "y" * 70_000}),
                       "ENGRAM_ARTIFACTS_MAX_DOCUMENT_BYTES")
    assert refusal.reason == "DOCUMENT_TOO_LARGE"
    _refused(lambda: env.client.start_run("run-2", metadata={"x": "y" * 20_000}),
             "ENGRAM_ARTIFACTS_MAX_METADATA_BYTES")


@pytest.mark.parametrize("bad", ["..", "...", "a\x00b", "run/1", "a b", "x" * 129])
def test_bad_ids_are_invalid_argument(artifacts_server: RunningArtifacts, bad: str) -> None:
    client = artifacts_server.client
    client.start_run("run-1")
    for call in (lambda: client.start_run(bad), lambda: client.get_run(bad),
                 lambda: client.append_event(bad, "t", {}),
                 lambda: client.append_event("run-1", "t", {}, request_id=bad),
                 lambda: client.create_snapshot("run-1", {}, request_id=bad),
                 lambda: client.upload(iter([b"x"]), run_id="run-1", step_id=bad, name="a"),
                 lambda: client.create_evidence(bad, "i", "k", 0, 1)):
        assert _refused(call).reason in ("INVALID_IDENTIFIER", "INVALID_ARGUMENT")
    assert _count(artifacts_server, RunRow) == 1
    assert list(artifacts_server.service.blobs.list()) == []


def test_nul_characters_are_refused_before_the_database(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    client = env.client
    run_id = client.start_run("run-1").run.run_id
    for call in (lambda: client.append_event(run_id, "ty\x00pe", {}),
                 lambda: client.append_event(run_id, "t", {"k": "v\x00"}),
                 lambda: client.append_event(run_id, "t", {"k\x00": 1}),
                 lambda: client.create_snapshot(run_id, ["\x00"]),
                 lambda: client.create_manifest({"a": "\x00"}),
                 lambda: client.start_run("run-2", metadata={"a": "\x00"}),
                 lambda: client.upload(iter([b"x"]), run_id=run_id, step_id="s", name="a",
                                       metadata={"a": "\x00"}),
                 lambda: client.upload(iter([b"x"]), run_id=run_id, step_id="s", name="a",
                                       mime_type="text/\x00"),
                 lambda: client.upload(iter([b"x"]), run_id=run_id, step_id="s", name="a\x00"),
                 lambda: client.stop_run(run_id, "failed", reason="why\x00")):
        _refused(call, "NUL")
    run = client.get_run(run_id)
    assert (run.status, run.event_count) == (pb.RUN_STATUS_RUNNING, 0)
    assert _count(env, ArtifactRow) == 0 and list(env.service.blobs.list()) == []


@pytest.fixture
def capped(artifacts_db_url: str, tmp_path: Path, engram_home: Path,
           make_token: Callable[..., str]) -> Iterator[RunningArtifacts]:
    with running_artifacts(artifacts_db_url, tmp_path / "blobs", engram_home, make_token,
                           max_upload_bytes=100_000) as running:
        yield running


def _chunks(total: int, size: int = 16_384) -> Iterator[bytes]:
    for start in range(0, total, size):
        yield b"z" * min(size, total - start)


def test_uploads_over_the_cap_are_refused_with_nothing_left(
        capped: RunningArtifacts, tmp_path: Path) -> None:
    env = capped
    run_id = env.client.start_run("run-1").run.run_id
    for declared in (None, 150_000):
        refusal = _refused(lambda size=declared: env.client.upload(
            _chunks(150_000), run_id=run_id, step_id="s", name="big", size_bytes=size),
            "ENGRAM_ARTIFACTS_MAX_UPLOAD_BYTES", "100000")
        assert refusal.reason == "LIMIT_EXCEEDED"
    assert _count(env, ArtifactRow) == 0 and list(env.service.blobs.list()) == []
    assert not [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    stored = env.client.upload(_chunks(100_000), run_id=run_id, step_id="s", name="big")
    assert stored.size_bytes == 100_000


# -- one key, many concurrent calls ------------------------------------------------

def _all_at_once(call: Callable[[int], T], threads: int = THREADS) -> list[T]:
    """``call(i)`` from ``threads`` threads released together."""
    barrier = threading.Barrier(threads)

    def run(index: int) -> T:
        barrier.wait()
        return call(index)

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(run, range(threads)))


def test_concurrent_append_event_retries_get_the_first_answer(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    clients = [env.client_for() for _ in range(THREADS)]
    answers = _all_at_once(lambda i: clients[i].append_event(run_id, "once", {"n": 1},
                                                             request_id="req-1"))
    assert sum(a.created for a in answers) == 1
    assert {(a.event.seq, a.event.hash) for a in answers} == {(1, answers[0].event.hash)}
    assert env.client.get_run(run_id).event_count == 1
    assert _count(env, EventRow) == 1


def test_concurrent_snapshots_of_one_request_id_are_one(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    env.client.append_event(run_id, "t", {})
    clients = [env.client_for() for _ in range(THREADS)]
    answers = _all_at_once(lambda i: clients[i].create_snapshot(run_id, {"s": 1},
                                                                request_id="snap-1"))
    assert len({a.snapshot_id for a in answers}) == 1
    assert _count(env, SnapshotRow) == 1


def test_concurrent_start_evidence_and_manifest_get_one_answer(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    clients = [env.client_for() for _ in range(THREADS)]
    runs = _all_at_once(lambda i: clients[i].start_run("run-1"))
    assert sum(r.created for r in runs) == 1 and len({r.run.create_time.ToMicroseconds()
                                                      for r in runs}) == 1
    manifests = _all_at_once(lambda i: clients[i].create_manifest({"m": 1}, run_id="run-1"))
    assert sum(m.created for m in manifests) == 1
    assert len({m.manifest.manifest_id for m in manifests}) == 1
    evidence = _all_at_once(lambda i: clients[i].create_evidence("c", "i", "k", 0, 5))
    assert sum(e.created for e in evidence) == 1
    assert len({e.evidence.create_time.ToMicroseconds() for e in evidence}) == 1


def test_concurrent_uploads_of_one_name_keep_the_winners_bytes(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    clients = [env.client_for() for _ in range(8)]

    def upload(index: int) -> Any:
        try:
            return clients[index].upload(_chunks(200_000 + index), run_id=run_id,
                                         step_id="s", name="same")
        except EngramRpcError as error:
            return error

    answers = _all_at_once(upload, threads=8)
    stored = [a for a in answers if not isinstance(a, EngramRpcError)]
    refused = [a for a in answers if isinstance(a, EngramRpcError)]
    assert len(stored) == 1
    assert {r.code for r in refused} == {grpc.StatusCode.ALREADY_EXISTS}
    _meta, chunks = env.client.read(stored[0].artifact_id)
    assert len(b"".join(chunks)) == stored[0].size_bytes
    assert env.client.verify(run_id).problems == []
    assert list(env.service.blobs.list()) == [stored[0].path]
