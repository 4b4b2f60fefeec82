"""Injected I/O failures under the file blob store (item 3 of issue 16, beside the full disk).

The artifacts service runs in this process with its real file:// blob store; the operating
system calls under that store are made to fail with EIO: the N-th write of an upload's bytes,
the fsync of the temporary file, the link that publishes it, the fsync of the directory after
the link. The compactor's warm segments and cold snapshots go through the same store.

Criterion, for each: the call that met the failure ends UNAVAILABLE ``STORAGE_IO_ERROR``
(never OK, never INTERNAL); nothing of it is listed or readable, no temporary file is left and
no blob file is left that no artifact row names; a failure that happens once is retried by
the SDK and the upload lands exactly once; once the fault is gone, uploads succeed on the
same server (no restart) and VerifyArtifacts finds nothing wrong. The compactor acknowledges
an iteration by its database commit, so there the criterion is the second test's.

gRPC's retry of an upload that failed while it was still being sent can deliver the next
attempt without some of its messages (grpcio 1.85: the trailer or chunks in the middle,
about 1 failure in 100 on two cores); the service refuses such a stream (UPLOAD_TRUNCATED,
nothing stored) and the SDK sends it again whole. The cut tests make that cut happen every
time, with an interceptor on the client's channel.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

import services.common.blobstore.file as file_store
from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client import EngramRpcError, open_channel
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from services.common.tokens import write_token_file
from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.integration.artifacts.conftest import RunningArtifacts, running_artifacts

pytestmark = [pytest.mark.faults]

PAYLOAD = [b"x" * 65536] * 4  # four writes of 64 KiB


class Fault:
    """Makes the ``at``-th call (1-based) of a wrapped OS function fail with EIO; with
    ``once`` only that call, otherwise every call from it on."""

    def __init__(self, at: int, once: bool) -> None:
        self.at, self.once = at, once
        self.calls = itertools.count(1)
        self.fired = 0

    def check(self) -> None:
        n = next(self.calls)
        if n == self.at or (n > self.at and not self.once):
            self.fired += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))


class _FailingFile:
    def __init__(self, handle: Any, fault: Fault) -> None:
        self._handle, self._fault = handle, fault

    def write(self, data: bytes) -> int:
        self._fault.check()
        return int(self._handle.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


@contextmanager
def injected(kind: str, *, at: int = 1, once: bool = False) -> Iterator[Fault]:
    """``kind``: write (the N-th write of the bytes), fsync (the N-th fsync: 1 the file,
    2 its directory after the link), link."""
    fault = Fault(at, once)
    patch = pytest.MonkeyPatch()
    try:
        if kind == "write":
            real_open = open

            def failing_open(*args: Any, **kwargs: Any) -> Any:
                return _FailingFile(real_open(*args, **kwargs), fault)

            patch.setattr(file_store, "open", failing_open, raising=False)
        else:
            real: Callable[..., Any] = getattr(os, kind)

            def failing(*args: Any, **kwargs: Any) -> Any:
                fault.check()
                return real(*args, **kwargs)

            patch.setattr(file_store.os, kind, failing)
        yield fault
    finally:
        patch.undo()


def _blob_files(env: RunningArtifacts) -> tuple[set[str], list[Path]]:
    published, temporary = set(), []
    for path in env.blob_root.rglob("*"):
        if path.is_file():
            if path.relative_to(env.blob_root).parts[0] == ".tmp":
                temporary.append(path)
            else:
                published.add(path.relative_to(env.blob_root).as_posix())
    return published, temporary


def _raw_upload(env: RunningArtifacts, run_id: str, name: str) -> None:
    """One attempt, no SDK retry: the status the service answers."""
    client = env.client
    messages = [pb.CreateArtifactRequest(header=pb.ArtifactHeader(run_id=run_id, step_id="s",
                                                                  name=name))]
    messages += [pb.CreateArtifactRequest(chunk=chunk) for chunk in PAYLOAD]
    messages.append(pb.CreateArtifactRequest(trailer=pb.ArtifactTrailer(
        size_bytes=sum(map(len, PAYLOAD)))))
    client.stub.CreateArtifact(iter(messages), metadata=client.metadata, timeout=30)


@pytest.fixture
def artifacts(tmp_path: Path, engram_home: Path,
              make_token: Callable[..., str]) -> Iterator[RunningArtifacts]:
    with running_artifacts(f"sqlite:///{tmp_path / 'artifacts.db'}", tmp_path / "blobs",
                           engram_home, make_token) as env:
        yield env


@pytest.mark.parametrize(("kind", "at"), [("write", 3), ("fsync", 1), ("link", 1),
                                          ("fsync", 2)],
                         ids=["nth-write", "file-fsync", "link", "directory-fsync"])
def test_an_io_error_is_unavailable_leaves_nothing_and_passes(
        artifacts: RunningArtifacts, kind: str, at: int) -> None:
    env = artifacts
    client = env.client
    run_id = client.start_run("io-run").run.run_id
    client.upload(iter([b"before"]), run_id=run_id, step_id="s", name="before.txt")

    with injected(kind, at=at) as fault, pytest.raises(grpc.RpcError) as caught:
        _raw_upload(env, run_id, "failed.bin")
    assert fault.fired, f"the {kind} fault never fired"
    error = EngramRpcError.from_rpc_error(caught.value)
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "STORAGE_IO_ERROR"), error
    listed = {a.path for a in client.list_artifacts(run_id)}
    assert not any(path.endswith("failed.bin") for path in listed), "a failed upload is listed"
    published, temporary = _blob_files(env)
    assert temporary == [], f"temporary files left: {temporary}"
    assert published == {a.path for a in client.list_artifacts(run_id)}, (
        "a blob file no artifact names (or an artifact without its file)")

    with injected(kind, at=at, once=True) as fault:  # fails once: the SDK's retry lands it
        landed = client.upload(iter(PAYLOAD), run_id=run_id, step_id="s", name="retried.bin")
    assert fault.fired == 1
    assert [a.artifact_id for a in client.list_artifacts(run_id)
            if a.path.endswith("retried.bin")] == [landed.artifact_id]

    after = client.upload(iter(PAYLOAD), run_id=run_id, step_id="s", name="after.bin")
    _meta, chunks = client.read(after.artifact_id)
    assert b"".join(chunks) == b"".join(PAYLOAD)
    checked = client.verify(run_id)
    assert checked.checked == 3 and not checked.problems
    published, temporary = _blob_files(env)
    assert temporary == [] and published == {a.path for a in client.list_artifacts(run_id)}


class CutStreams(grpc.StreamUnaryClientInterceptor):
    """Delivers the first ``times`` request streams of a channel without the messages
    ``dropped`` picks (index, message), as gRPC's retry of a stream cut mid-send did: the
    SDK hands every message over, the service receives the stream short of some."""

    def __init__(self, dropped: Callable[[int, Message], bool], times: int = 1) -> None:
        self.dropped, self.times, self.calls = dropped, times, 0

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any,
                               requests: Iterator[Message]) -> Any:
        self.calls += 1
        if self.calls <= self.times:
            requests = (m for i, m in enumerate(requests) if not self.dropped(i, m))
        return continuation(details, requests)


def _trailer(_index: int, message: Message) -> bool:
    return message.WhichOneof("part") == "trailer"


def _second_chunk(index: int, _message: Message) -> bool:
    return index == 2


def _cut_client(env: RunningArtifacts, cut: CutStreams, token: str) -> ArtifactsClient:
    channel = grpc.intercept_channel(open_channel(env.server.address), cut)
    return ArtifactsClient(env.server.address, token, channel=channel, timeout=30)


@pytest.mark.parametrize("dropped", [_trailer, _second_chunk], ids=["trailer", "a-chunk"])
def test_an_upload_received_cut_short_is_sent_again_whole_and_lands_once(
        artifacts: RunningArtifacts, make_token: Callable[..., str],
        dropped: Callable[[int, Message], bool]) -> None:
    """Without the SDK's resend: INVALID_ARGUMENT UPLOAD_TRUNCATED for a whole upload."""
    env = artifacts
    cut = CutStreams(dropped)
    with _cut_client(env, cut, make_token("agent-1", "fleet-a")) as client:
        run_id = client.start_run("cut-run").run.run_id
        landed = client.upload(iter(PAYLOAD), run_id=run_id, step_id="s", name="cut.bin")
        assert cut.calls == 2, "the upload was not sent again"
        assert [a.artifact_id for a in client.list_artifacts(run_id)] == [landed.artifact_id]
        _meta, chunks = client.read(landed.artifact_id)
        assert b"".join(chunks) == b"".join(PAYLOAD)
        assert not client.verify(run_id).problems
    published, temporary = _blob_files(env)
    assert temporary == [] and published == {landed.path}


def test_an_upload_cut_every_time_or_too_large_to_resend_is_unavailable_and_a_short_one_is_not(
        artifacts: RunningArtifacts, make_token: Callable[..., str]) -> None:
    """Resent at most max_retries times; a stream larger than the SDK keeps is not resent;
    either way the caller is told to send it again (UNAVAILABLE), and nothing is stored. A
    stream shorter than its declared size is the caller's error and is not sent again."""
    env = artifacts
    token = make_token("agent-1", "fleet-a")
    run_id = env.client.start_run("cut-run").run.run_id
    for chunks, times, sends in (
            (PAYLOAD, 100, 1 + ArtifactsClient.max_retries),
            ([b"y" * (1 << 20)] * 5, 1, 1)):  # over the 4 MiB the SDK keeps
        cut = CutStreams(_trailer, times=times)
        with _cut_client(env, cut, token) as client, pytest.raises(EngramRpcError) as caught:
            client.upload(iter(chunks), run_id=run_id, step_id="s", name="cut.bin")
        assert (caught.value.code, caught.value.reason) == (
            grpc.StatusCode.UNAVAILABLE, "UPLOAD_TRUNCATED"), caught.value
        assert cut.calls == sends
    cut = CutStreams(lambda _index, _message: False)
    with _cut_client(env, cut, token) as client, pytest.raises(EngramRpcError) as caught:
        client.upload(iter(PAYLOAD), run_id=run_id, step_id="s", name="short.bin",
                      size_bytes=sum(map(len, PAYLOAD)) + 1)
    assert (caught.value.code, caught.value.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT, "UPLOAD_TRUNCATED"), caught.value
    assert cut.calls == 1
    assert list(env.client.list_artifacts(run_id)) == []
    assert _blob_files(env) == (set(), [])


def test_an_import_received_cut_short_is_sent_again_whole(
        tmp_path: Path, engram_home: Path, make_token: Callable[..., str]) -> None:
    with running_artifacts(f"sqlite:///{tmp_path / 'origin.db'}", tmp_path / "origin",
                           engram_home, make_token) as origin, \
            running_artifacts(f"sqlite:///{tmp_path / 'target.db'}", tmp_path / "target",
                              engram_home, make_token) as target:
        source = origin.client
        source.start_run("run-1")
        artifact = source.upload(iter(PAYLOAD), run_id="run-1", step_id="s", name="a.bin")
        run = source.get_run("run-1")
        cut = CutStreams(_trailer)
        with _cut_client(target, cut, make_token("op", "fleet-a", ("admin",))) as admin:
            admin.import_run(run)
            assert admin.import_artifact(artifact, iter(PAYLOAD)).created
            assert cut.calls == 2
            _meta, chunks = admin.read(artifact.artifact_id)
            assert b"".join(chunks) == b"".join(PAYLOAD)


def test_the_compactor_keeps_every_iteration_through_io_errors_and_repairs_its_tiers(
        tmp_path: Path, engram_home: Path, make_token: Callable[..., str]) -> None:
    """Warm segments and cold snapshots are the tier work after the commit that acknowledges
    an iteration: with every fsync under the blob store failing EIO, each RecordIteration is
    still acknowledged (its line is committed), VerifyRun names the pending tier work, and once
    the fault is gone the repair loop seals and snapshots the run on the same process: VerifyRun
    clean and every iteration reconstructed."""
    shard, _service = build_shard_server(ShardSettings(
        home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}", port=0,
        allow_ungated=True))
    shard.start()
    token_file = tmp_path / "compactor.token"
    write_token_file(token_file, make_token("svc-compactor", "system", ("service",)))
    blobs = tmp_path / "blobs"
    compactor = build_compactor_server(CompactorSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'compactor.db'}",
        blob_url=blobs.resolve().as_uri(), shard_addr=shard.address,
        service_token_file=token_file, rotate_bytes=2000, snapshot_every=5, keep_snapshots=3,
        hot_size=4, tier_repair_interval_seconds=0.1, tier_repair_backoff_seconds=0.2,
        tier_repair_backoff_max_seconds=0.5)).start()
    try:
        with CompactorClient(compactor.address, make_token("agent-1", "fleet-a")) as client:
            with injected("fsync") as fault:
                for n in range(1, 13):
                    reply = client.record("io-run", cpb.IterationInput(
                        iteration=n, plan_digest=f"p{n}", status="ok",
                        detail_json=json.dumps({"notes": "x" * 300, "n": n})))
                    assert reply.created
                assert fault.fired, "no tier work reached the blob store"
                report = client.verify("io-run")
                assert not report.ok
                assert [p for p in report.problems if p.location == "tier work"]
            deadline = time.monotonic() + 20
            while not client.verify("io-run").ok:
                assert time.monotonic() < deadline, "the tier work was never repaired"
                time.sleep(0.1)
            report = client.verify("io-run")
            assert report.last_iteration == 12 and report.snapshots_checked >= 1
            for n in range(1, 13):
                assert client.reconstruct("io-run", n).summary.iteration == n
        assert not [p for p in (blobs / ".tmp").glob("*")], "temporary files left"
    finally:
        compactor.stop(0)
        shard.stop(0)
