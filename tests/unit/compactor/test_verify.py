"""verify finds a tampered, deleted or reordered warm line, in a sealed segment or the database."""

from __future__ import annotations

import gzip
import itertools
import json
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from services.common.blobstore.file import FileBlobStore
from services.common.errors import IntegrityError
from services.compactor.domain.model import RunView
from services.compactor.service import IterationLog
from tests.unit.compactor.support import LogFactory, make_iteration

F, R = "fleet-a", "run-v"


@pytest.fixture
def log(make_log: LogFactory) -> IterationLog:
    built = make_log(rotate_bytes=2500, snapshot_every=5, keep_snapshots=10)
    for n in range(1, 31):
        built.record(F, R, make_iteration(n))
    assert built.verify(F, R).ok
    assert len(built.repo.sealed_segments(F, R)) >= 2
    return built


def _segment_path(log: IterationLog, blobs: FileBlobStore, number: int = 0) -> Path:
    return blobs.root / log.repo.sealed_segments(F, R)[number].key


def _rewrite(path: Path, edit: object) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")  # type: ignore[operator]


def _problems(log: IterationLog) -> str:
    report = log.verify(F, R)
    assert not report.ok
    return " | ".join(f"{loc}: {detail}" for loc, detail in report.problems)


def test_tampered_line_in_a_sealed_segment(log: IterationLog, blobs: FileBlobStore) -> None:
    def edit(lines: list[str]) -> list[str]:
        lines[1] = lines[1].replace('"netAdd":6', '"netAdd":600')
        return lines

    _rewrite(_segment_path(log, blobs), edit)
    found = _problems(log)
    assert "segment 1 line 2" in found and "tampered" in found
    assert "does not match the digest" in found
    with pytest.raises(IntegrityError):
        log.reconstruct(F, R, 2)


def test_deleted_line_in_a_sealed_segment(log: IterationLog, blobs: FileBlobStore) -> None:
    _rewrite(_segment_path(log, blobs, 1), lambda lines: lines[:2] + lines[3:])
    found = _problems(log)
    assert "deleted, duplicated or reordered" in found and "prevHash" in found


def test_reordered_lines_in_a_sealed_segment(log: IterationLog, blobs: FileBlobStore) -> None:
    _rewrite(_segment_path(log, blobs), lambda lines: [lines[1], lines[0], *lines[2:]])
    found = _problems(log)
    assert "expected iteration 1, found 2" in found


@pytest.mark.parametrize("change", ["tamper", "delete", "reorder"])
def test_active_lines_in_the_database(log: IterationLog, change: str) -> None:
    last = log.last_iteration(F, R)
    with log.repo.db.engine.begin() as conn:
        if change == "tamper":
            conn.execute(text("UPDATE compactor_warm_lines SET line = replace(line, "
                              "'\"status\":\"success\"', '\"status\":\"failed\"') "
                              "WHERE iteration = :i"), {"i": last - 1})
        elif change == "delete":
            conn.execute(text("DELETE FROM compactor_warm_lines WHERE iteration = :i"),
                         {"i": last - 1})
        else:
            conn.execute(text("UPDATE compactor_warm_lines SET iteration = -1 "
                              "WHERE iteration = :i"),
                         {"i": last})
            conn.execute(text("UPDATE compactor_warm_lines SET iteration = :i "
                              "WHERE iteration = :j"), {"i": last, "j": last - 1})
            conn.execute(text("UPDATE compactor_warm_lines SET iteration = :j "
                              "WHERE iteration = -1"), {"j": last - 1})
    found = _problems(log)
    expected = {"tamper": "tampered", "delete": "deleted, duplicated or reordered",
                "reorder": "prevHash does not link"}[change]
    assert expected in found


def test_tampered_cold_snapshot_and_missing_index(log: IterationLog,
                                                  blobs: FileBlobStore) -> None:
    snapshot = log.repo.snapshots(F, R)[0]
    path = blobs.root / snapshot.key
    document = json.loads(gzip.decompress(path.read_bytes()))
    document["detail"]["metrics"]["n"] = 999
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    head = log.repo.head(F, R)
    assert head is not None
    (blobs.root / f"{F}/{R}/warm/index/{head.index_version:06d}.json").unlink()
    found = _problems(log)
    assert f"snapshot {snapshot.iteration}" in found and "index file" in found
    with pytest.raises(IntegrityError, match="does not match its digest"):
        log.reconstruct(F, R, snapshot.iteration)


class _WatchedLock:
    """A run lock that says when a thread had to wait for it."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.waited = threading.Event()

    def __enter__(self) -> _WatchedLock:
        if not self._lock.acquire(blocking=False):
            self.waited.set()
            self._lock.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()


def test_a_seal_and_a_retirement_between_the_view_and_its_reads_are_not_damage(
        make_log: LogFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """VerifyRun reads the run's view (head, sealed segments, stored snapshots), then the index
    file and the snapshot files it names. A seal committing in between deletes that index file
    (a newer one replaces it), a retirement a snapshot: on a run being appended to, verify
    reported "index file .../000047.json is missing" when that happened under each of its
    re-reads. Here appends seal and retire right after every view verify takes, until they
    are done or have to wait for the run's lock."""
    log = make_log(rotate_bytes=1500, snapshot_every=5, keep_snapshots=3)
    for n in range(1, 31):
        log.record(F, R, make_iteration(n))
    assert log.verify(F, R).ok
    watched = _WatchedLock(log.run_lock(F, R))
    monkeypatch.setattr(log, "run_lock", lambda _fleet, _run: watched)
    next_iteration = itertools.count(31)
    appenders: list[threading.Thread] = []
    errors: list[BaseException] = []
    real_view = log.repo.view

    def view_then_seal_and_retire(fleet_id: str, run_id: str) -> RunView | None:
        view = real_view(fleet_id, run_id)
        assert view is not None and view.sealed and view.snapshots
        index, oldest = view.head.index_version, view.snapshots[0].iteration

        def moved_on() -> bool:
            head = log.repo.head(F, R)
            stored = [s.iteration for s in log.repo.snapshots(F, R)]
            return head is not None and head.index_version > index and oldest not in stored

        def append() -> None:
            try:
                while not moved_on():
                    log.record(F, R, make_iteration(next(next_iteration)))
            except BaseException as error:  # reported by the test, not lost in the thread
                errors.append(error)

        watched.waited.clear()
        appender = threading.Thread(target=append)
        appenders.append(appender)
        appender.start()
        deadline = time.monotonic() + 30
        while appender.is_alive() and not watched.waited.is_set() \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        return view

    monkeypatch.setattr(log.repo, "view", view_then_seal_and_retire)
    report = log.verify(F, R)
    for appender in appenders:
        appender.join(timeout=30)
    monkeypatch.undo()
    assert not errors and not any(a.is_alive() for a in appenders)
    assert report.ok, list(report.problems)
    assert appenders and log.last_iteration(F, R) > 30
    assert log.verify(F, R).ok
