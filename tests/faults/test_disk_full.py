"""A full disk under the shard, the artifacts service and the compactor (item 3 of issue 16).

Each of the three gets its own small tmpfs as its data directory (database, WAL, blobs, warm
log); governance keeps its disk. After a few writes succeed, a filler file takes every free
byte of each volume. Then every write to each service is tried several times.

Criterion: every write on a full volume ends in RESOURCE_EXHAUSTED with reason STORAGE_FULL
(never OK, never INTERNAL); no partial artifact is listed or readable and no temporary file is
left; once the filler is deleted, writes succeed again on the same processes (no restart), and
every stored record, artifact and iteration verifies.

Needs root (to mount tmpfs); skipped without it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram.client import ArtifactsClient, CompactorClient, EngramRpcError, ShardClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from tests.faults.conftest import Stack, scale

pytestmark = [pytest.mark.faults]

VOLUME = "6m"
FULL_SERVICES = ("shard", "artifacts", "compactor")


def _mount(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={VOLUME}", "tmpfs", str(path)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): needs root")


@pytest.fixture
def volumes(stack: Stack) -> Iterator[dict[str, Path]]:
    mounted = []
    try:
        for name in FULL_SERVICES:
            _mount(stack.home / name)
            mounted.append(stack.home / name)
        yield {name: stack.home / name for name in FULL_SERVICES}
    finally:
        stack.stop_all()
        for path in mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(volume: Path) -> Path:
    """Take every free byte of ``volume``; the filler's path."""
    filler = volume / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 64 << 10, 4096, 512, 1):
            try:
                while os.write(descriptor, b"\0" * size):
                    pass
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
    finally:
        os.close(descriptor)
    return filler


def _storage_full(call: object) -> None:
    with pytest.raises(EngramRpcError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code.name == "RESOURCE_EXHAUSTED", caught.value
    assert caught.value.reason == "STORAGE_FULL", caught.value
    assert "Traceback" not in caught.value.message and "/" not in caught.value.message.split(
        "(")[0], caught.value.message


def _iteration(n: int) -> cpb.IterationInput:
    return cpb.IterationInput(iteration=n, plan_digest=f"plan-{n}", status="ok",
                              files_touched=1, net_add=n, detail_json=f'{{"step": {n}}}')


def test_a_full_disk_is_storage_full_every_time_and_recovers_without_restart(
    stack: Stack, volumes: dict[str, Path]
) -> None:
    for name in ("governance", "artifacts", "shard", "compactor"):
        stack.start(name)
    pids = {name: stack.popen(name).pid for name in FULL_SERVICES}
    token = stack.token("agent-full")
    attempts = scale(3, 20)
    with ShardClient(stack.address("shard"), token) as shard, \
            ArtifactsClient(stack.address("artifacts"), token) as art, \
            CompactorClient(stack.address("compactor"), token) as comp:
        before = [shard.add(f"fact {i} before the disk filled", run_id="full-run").record.id
                  for i in range(3)]
        art.start_run("full-run")
        kept = art.upload([b"a" * 4096], run_id="full-run", step_id="s", name="before.bin")
        for n in range(1, 4):
            comp.record("full-run", _iteration(n))

        fillers = [_fill(volume) for volume in volumes.values()]
        for attempt in range(attempts):
            _storage_full(lambda a=attempt: shard.add(f"fact {a} on a full disk",
                                                      run_id="full-run"))
            _storage_full(lambda a=attempt: art.upload([os.urandom(256 << 10)],
                                                       run_id="full-run", step_id="s",
                                                       name=f"full-{a}.bin"))
            _storage_full(lambda: comp.record("full-run", _iteration(4)))
        # Nothing half-stored: the refused artifact is neither listed nor left on disk.
        assert [a.artifact_id for a in art.list_artifacts("full-run")] == [kept.artifact_id]
        assert not [p for p in volumes["artifacts"].rglob("*")
                    if p.is_file() and p.name != "filler" and ".tmp" in p.name]
        for filler in fillers:
            filler.unlink()

        deadline = time.monotonic() + 30  # a bound on waiting, not a speed assertion
        while True:
            try:
                after = shard.add("a fact after space returned", run_id="full-run").record.id
                break
            except EngramRpcError as error:
                assert error.reason == "STORAGE_FULL" and time.monotonic() < deadline, error
                time.sleep(0.2)
        again = art.upload([b"b" * 4096], run_id="full-run", step_id="s", name="after.bin")
        comp.record("full-run", _iteration(4))
        assert {name: stack.popen(name).pid for name in FULL_SERVICES} == pids  # no restart

        for record_id in [*before, after]:
            assert shard.get(record_id).id == record_id
        assert not shard.verify(all_records=True).failures
        assert {a.artifact_id for a in art.list_artifacts("full-run")} == \
            {kept.artifact_id, again.artifact_id}
        assert not art.verify("full-run").problems
        assert comp.verify("full-run").ok
