"""A crash at each step of rotation, snapshotting and retention leaves a log that verifies,
with no acknowledged iteration lost or duplicated.

In-process: the step hook raises at the named step, the IterationLog is dropped (the process
"died") and a fresh one over the same database and blob directory recovers. Out of process: a
child records iterations and SIGKILLs itself at the step; the parent recovers its store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.compactor.domain.model import SnapshotState, TierConfig
from services.compactor.domain.warm_chain import WarmLine
from services.compactor.repository import CompactorRepository
from services.compactor.server import MIGRATIONS
from services.compactor.service import IterationLog
from services.compactor.tiers.steps import STEPS
from tests.fsyncs import record_fsyncs
from tests.unit.compactor.support import LogFactory, make_iteration

F, R = "fleet-a", "run-crash"
TOTAL = 24
# Small segments and frequent snapshots so every step happens many times; the detail is large
# and poorly compressible so a snapshot's gzip stream has several chunks.
CONFIG = {"rotate_bytes": 1500, "snapshot_every": 4, "keep_snapshots": 2, "hot_size": 3}
DETAIL = 150_000


class SimulatedCrash(BaseException):
    """Raised by the hook; BaseException so nothing on the way can swallow it."""


def _assert_whole(log: IterationLog, acknowledged: dict[int, WarmLine]) -> None:
    report = log.verify(F, R)
    assert report.ok, report.problems
    lines = log.summaries(F, R, 1, TOTAL)
    assert [x.iteration for x in lines] == list(range(1, TOTAL + 1))
    for line in lines:
        if line.iteration in acknowledged:
            assert line == acknowledged[line.iteration]
    for n in range(1, TOTAL + 1):
        assert log.reconstruct(F, R, n).summary == lines[n - 1]


@pytest.mark.parametrize("step", STEPS)
def test_crash_at_each_step_then_recovery(step: str, make_log: LogFactory,
                                          blobs: FileBlobStore) -> None:
    fired: list[int] = []
    current = [0]

    def crash_once(name: str) -> None:
        # skip the first occurrences so the crash lands in a run with history behind it
        if name == step and not fired and current[0] >= 9:
            fired.append(current[0])
            raise SimulatedCrash(name)

    log = make_log(crash_once, **CONFIG)
    acknowledged: dict[int, WarmLine] = {}
    n = 1
    while n <= TOTAL:
        current[0] = n
        try:
            acknowledged[n] = log.record(F, R, make_iteration(n, size=DETAIL)).line
        except SimulatedCrash:
            assert not any((blobs.root / ".tmp").iterdir()), "a temp file was left behind"
            # what a reader sees right after the crash, before any repair
            assert make_log(**CONFIG).verify(F, R).ok
            log = make_log(**CONFIG)
            assert log.recover() == 1
            continue  # the caller retries the unacknowledged iteration
        n += 1
    assert fired, f"the crash at {step} never happened"
    _assert_whole(log, acknowledged)
    assert log.repo.head(F, R) is not None and not log.repo.head(F, R).pending_work  # type: ignore[union-attr]
    assert not log.repo.snapshots(F, R, SnapshotState.RETIRING)
    assert not log.repo.snapshots(F, R, SnapshotState.PENDING)
    kept = [s.iteration for s in log.repo.snapshots(F, R)]
    assert kept == [20, 24]
    assert [k.rsplit("/", 1)[1] for k in blobs.list(f"{F}/{R}/cold/")] == [
        "0000000020.json.gz", "0000000024.json.gz"]


_CHILD = r"""
import os, signal, sys
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.compactor.service import IterationLog
from services.compactor.domain.model import TierConfig
from services.compactor.repository import CompactorRepository
from tests.unit.compactor.support import make_iteration

root, step, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
current = [0]
def die(name):
    if name == step and current[0] >= 9:
        os.kill(os.getpid(), signal.SIGKILL)
db = Database(f"sqlite:///{root}/c.db")
log = IterationLog(CompactorRepository(db), FileBlobStore(f"{root}/blobs"),
                   TierConfig(rotate_bytes=1500, snapshot_every=4, keep_snapshots=2, hot_size=3),
                   hook=die)
for n in range(1, total + 1):
    current[0] = n
    log.record("fleet-a", "run-crash", make_iteration(n, size=150_000))
    print(n, flush=True)
"""


@pytest.mark.parametrize("step", ["seal:before_rename", "snapshot:mid_gzip", "retention:mid"])
def test_sigkill_at_a_step_then_recovery(step: str, tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'c.db'}")
    db.upgrade(MIGRATIONS)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), step, str(TOTAL)],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        timeout=120, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    acked = [int(x) for x in child.stdout.split()]
    blobs = FileBlobStore(tmp_path / "blobs")
    log = IterationLog(CompactorRepository(db), blobs, TierConfig(**CONFIG))
    leftovers = list((blobs.root / ".tmp").iterdir())
    if step == "seal:before_rename":
        # killed with the segment fully in its temp file: present on disk, never a visible key
        assert leftovers and not any(".part" in key for key in blobs.list())
    assert log.verify(F, R).ok
    log.recover()
    head = log.repo.head(F, R)
    assert head is not None and head.last_iter >= acked[-1]
    for n in range(head.last_iter + 1, TOTAL + 1):
        log.record(F, R, make_iteration(n, size=DETAIL))
    for n in acked:
        assert log.record(F, R, make_iteration(n, size=DETAIL)).created is False
    _assert_whole(log, {})
    db.dispose()


def test_a_redone_seal_makes_the_segment_it_finds_durable(
        make_log: LogFactory, database: Database, blobs: FileBlobStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a seal redone after a crash between the segment's link and its fsyncs
    found the same bytes and went on without syncing them, then committed and deleted the
    database's copy; a power loss could then lose the lines. The file and every directory up
    to the store's root must be synced before the seal goes past its put."""
    def crash_after_put(name: str) -> None:
        if name == "seal:after_rename":
            raise SimulatedCrash(name)

    log = make_log(crash_after_put, **CONFIG)
    with pytest.raises(SimulatedCrash):
        for n in range(1, TOTAL + 1):
            log.record(F, R, make_iteration(n))
    [key] = blobs.list(f"{F}/{R}/warm/segments/")  # visible; what was synced is unknown

    seen_at_put: set[Path] = set()

    def after_put(name: str) -> None:
        if name == "seal:after_rename":
            seen_at_put.update(synced)

    synced = record_fsyncs(monkeypatch)
    restarted = FileBlobStore(blobs.root)  # a new process: it has synced nothing
    log = IterationLog(CompactorRepository(database), restarted, TierConfig(**CONFIG), after_put)
    assert log.recover() == 1
    segment = restarted.root / key
    assert {segment, *[d for d in segment.parents if d.is_relative_to(restarted.root)]} <= (
        seen_at_put)
    assert log.verify(F, R).ok and not log.repo.head(F, R).pending_work  # type: ignore[union-attr]
