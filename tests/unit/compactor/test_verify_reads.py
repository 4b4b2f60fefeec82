"""VerifyRun and pins (found by review on 2026-11-29): the cold snapshot files are read
without the run's lock, which 64 runs share (a run with many pinned snapshots held it for the
whole read); a run holds at most MAX_PINS_PER_RUN pins (each keeps a snapshot from
retirement); a segment an erasure in place rewrites while VerifyRun reads is not reported as
missing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.common.erasure_source import ErasureOrder
from services.common.errors import FailedPrecondition
from services.compactor import repository
from services.compactor.domain.model import TierConfig
from services.compactor.line_erasure import LineEraser
from services.compactor.repository import CompactorRepository
from services.compactor.service import IterationLog
from tests.unit.compactor.support import LogFactory, make_iteration

F, R = "fleet-a", "run-v"


class WatchedBlobs(FileBlobStore):
    """A file blob store that calls ``on_open(key)`` before each read."""

    def __init__(self, root: Path, on_open: Callable[[str], None]) -> None:
        super().__init__(root)
        self.on_open = on_open

    def open(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        self.on_open(key)
        return super().open(key, chunk_size)


def test_snapshot_files_are_read_without_the_run_lock(database: Database,
                                                      tmp_path: Path) -> None:
    held: list[bool] = []
    log: IterationLog | None = None

    def on_open(key: str) -> None:
        if "/cold/" in key and log is not None:
            held.append(log.run_lock(F, R).locked())

    log = IterationLog(CompactorRepository(database), WatchedBlobs(tmp_path / "b", on_open),
                       TierConfig(snapshot_every=2, hot_size=2))
    for n in range(1, 9):
        log.record(F, R, make_iteration(n))
    held.clear()
    report = log.verify(F, R)
    assert report.ok and report.snapshots_checked == 4
    assert held == [False] * 4  # before the fix: [True] * 4


def test_a_run_holds_at_most_its_pins(make_log: LogFactory,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repository, "MAX_PINS_PER_RUN", 3)
    log = make_log(snapshot_every=2, hot_size=2)
    for n in range(1, 9):
        log.record(F, R, make_iteration(n))
    pins = [log.pin(F, R, n, "keep") for n in (2, 4, 6)]
    with pytest.raises(FailedPrecondition) as refused:
        log.pin(F, R, 8, "one more")
    assert (refused.value.reason, refused.value.metadata) == ("PIN_LIMIT", {"limit": "3"})
    assert log.pin(F, R, 4, "again") == pins[1]  # a pin held is still answered
    assert log.verify(F, R).ok


def test_a_segment_rewritten_by_an_erasure_while_verify_reads_is_no_damage(
        database: Database, tmp_path: Path) -> None:
    erased: list[str] = []
    log: IterationLog | None = None
    blobs: WatchedBlobs | None = None

    def on_open(key: str) -> None:
        if "/warm/segments/" in key and not erased and log is not None and blobs is not None:
            erased.append(key)  # an erasure in place lands between the view and the read
            line = log.summary(F, R, 2)
            order = ErasureOrder("era_" + "2" * 28, F, "op", (("iteration", f"{R}:2",
                                                                line.hash),))
            with log.run_lock(F, R):
                LineEraser(log, database, blobs).erase(order, R, [(2, line.hash)], 7,
                                                       lambda: None)

    blobs = WatchedBlobs(tmp_path / "b", on_open)
    log = IterationLog(CompactorRepository(database), blobs, TierConfig(rotate_bytes=1024))
    for n in range(1, 9):
        log.record(F, R, make_iteration(n))
    report = log.verify(F, R)
    assert erased and report.ok, report.problems  # before the retry: "segment ... missing"
    assert report.tombstoned == 1
