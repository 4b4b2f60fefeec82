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

import services.common.blobstore.file as file_store
from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client import EngramRpcError
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
