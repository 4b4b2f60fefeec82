"""Erasing iterations in place beside crashes, failures, reads and retries (found by review on
2026-11-29): a crash between the rewrite's blob writes and its commit no longer wedges every
later seal (BLOB_CONFLICT on the next index file); a blob store failing after the commit no
longer leaves the store's purge unowed (the erased line stayed in SQLite's WAL); a read racing
the rewrite of a segment reads again instead of answering NOT_FOUND; a retry of the call that
recorded an erased iteration is ITERATION_ERASED, not the erased content recorded again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.common.errors import AlreadyExists, Unavailable
from services.compactor import line_erasure
from services.compactor.domain.model import TierConfig
from services.compactor.erasure import IterationEraser
from services.compactor.repository import CompactorRepository
from services.compactor.service import IterationLog
from services.compactor.tables import PinRow
from tests.unit.compactor.support import RecordedErasures, make_iteration

F, R = "fleet-a", "run-e"
MARKER = "zqxfault"


class FlakyBlobs(FileBlobStore):
    """Lists fail while ``failing`` is set (a store gone after the erasure's commit)."""

    failing = False

    def list(self, prefix: str = "") -> Iterator[str]:
        if self.failing:
            raise Unavailable("the blob store is down", reason="BLOB_STORE_UNAVAILABLE")
        return super().list(prefix)


def _setup(database: Database, tmp_path: Path) -> tuple[IterationLog, FlakyBlobs, RecordedErasures,
                                                        IterationEraser]:
    blobs = FlakyBlobs(tmp_path / "blobs")
    log = IterationLog(CompactorRepository(database), blobs,
                       TierConfig(hot_size=3, rotate_bytes=1024, snapshot_every=4),
                       clock=lambda: 0.0)
    source = RecordedErasures(F)
    return log, blobs, source, IterationEraser(log, database, blobs, source)


def _marked(n: int) -> object:
    return replace(make_iteration(n), detail_json=json.dumps({"said": MARKER}))


def test_a_crash_between_the_rewrite_and_its_commit_leaves_later_seals_working(
        database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, _blobs, source, eraser = _setup(database, tmp_path)
    lines = [log.record(F, R, make_iteration(n)).line for n in range(1, 13)]
    erasure = source.add([("iteration", f"{R}:2", lines[1].hash)])
    rewrite = line_erasure.LineEraser._rewrite

    def crashing(self: line_erasure.LineEraser, *args: object, **kwargs: object) -> object:
        rewrite(self, *args, **kwargs)  # type: ignore[arg-type]
        raise RuntimeError("the process died before the commit")

    monkeypatch.setattr(line_erasure.LineEraser, "_rewrite", crashing)
    with pytest.raises(RuntimeError):
        eraser.erase(F, erasure, 1)
    monkeypatch.setattr(line_erasure.LineEraser, "_rewrite", rewrite)
    for n in range(13, 25):  # appends go on; seals fall due
        log.record(F, R, make_iteration(n))
    log.recover()
    assert log.repairs.failure((F, R)) is None  # before: BLOB_CONFLICT on the index file
    report = log.verify(F, R)
    assert report.ok and report.tombstoned == 0, report.problems
    assert eraser.erase(F, erasure, 2).iterations == 1  # carried out again: erased
    report = log.verify(F, R)
    assert report.ok and report.tombstoned == 1, report.problems


def test_a_blob_store_failing_after_the_commit_leaves_the_purge_owed(
        database: Database, tmp_path: Path) -> None:
    log, blobs, source, eraser = _setup(database, tmp_path)
    first = [log.record(F, R, make_iteration(n)).line for n in range(1, 5)]
    eraser.erase(F, source.add([("iteration", f"{R}:1", first[0].hash)]), 1)  # purges once
    marked = log.record(F, R, _marked(5)).line
    erasure = source.add([("iteration", f"{R}:5", marked.hash)])
    blobs.failing = True
    with pytest.raises(Unavailable):
        eraser.erase(F, erasure, 2)
    blobs.failing = False
    done = eraser.erase(F, erasure, 3)  # the rerun the error asks for
    assert (done.iterations, done.already) == (0, 1)
    for path in tmp_path.glob("compactor.db*"):  # the WAL was truncated: the purge was owed
        assert MARKER.encode() not in path.read_bytes(), path


def test_a_read_racing_the_rewrite_of_a_segment_reads_again(
        database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, _blobs, source, eraser = _setup(database, tmp_path)
    lines = [log.record(F, R, make_iteration(n)).line for n in range(1, 13)]
    listing = log.repo.warm_lines
    raced: list[bool] = []

    def erased_after_listing(*args: object, **kwargs: object) -> object:
        listed = listing(*args, **kwargs)  # type: ignore[arg-type]
        if not raced:  # the erasure rewrites the segment between the listing and the read
            raced.append(True)
            eraser.erase(F, source.add([("iteration", f"{R}:2", lines[1].hash)]), 1)
        return listed

    monkeypatch.setattr(log.repo, "warm_lines", erased_after_listing)
    read = log.summaries(F, R, 1, 4)  # before: NOT_FOUND for a run that exists
    assert [x.iteration for x in read] == [1, 2, 3, 4] and read[1].erased


def test_a_retry_of_the_call_that_recorded_an_erased_iteration_records_nothing(
        database: Database, tmp_path: Path) -> None:
    log, _blobs, source, eraser = _setup(database, tmp_path)
    log.record(F, R, make_iteration(1))
    item = replace(_marked(0), iteration=0)  # "the next one", with a request id for retries
    recorded = log.record(F, R, item, request_id="req-2").line
    eraser.erase(F, source.add([("iteration", f"{R}:2", recorded.hash)]), 1)
    with pytest.raises(AlreadyExists) as refused:
        log.record(F, R, item, request_id="req-2")
    assert refused.value.reason == "ITERATION_ERASED"  # before: recorded again as iteration 3
    assert log.last_iteration(F, R) == 2


def test_a_pin_whose_reason_holds_the_text_goes_with_its_iteration(
        database: Database, tmp_path: Path) -> None:
    """A pin's reason is an operator's text about its iteration: ``--match`` finds it there
    and erasing the iteration in place deletes the pin (before, only erasing the whole log
    removed it, and nothing found it)."""
    log, _blobs, source, eraser = _setup(database, tmp_path)
    for n in range(1, 7):
        log.record(F, R, make_iteration(n))
    log.pin(F, R, 4, f"customer {MARKER} complained")
    log.pin(F, R, 5, "an unrelated anomaly")
    (found,), _ = eraser.find(F, MARKER, 10)
    assert [(i.iteration, found.whole_log_needed) for i in found.iterations] == [(4, False)]
    eraser.erase(F, source.add([("iteration", f"{R}:4", found.iterations[0].leaf_hash)]), 1)
    with database.session() as session:
        assert list(session.scalars(select(PinRow.iteration))) == [5]
    assert not eraser.find(F, MARKER, 10)[0]
    for path in tmp_path.glob("compactor.db*"):
        assert MARKER.encode() not in path.read_bytes(), path
