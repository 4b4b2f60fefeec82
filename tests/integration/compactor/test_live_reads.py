"""Reads of a run that is being appended to: a seal (lines leave the database for a segment
file, an older index is deleted) or a snapshot's retirement committed between two of a read's
queries must not look like a broken or incomplete warm log. SQLite and Postgres.

Before each read took one snapshot, VerifyRun reported "the run's head is iteration N; the warm
log ends at N+1" (head read before the lines) on a live run, and a read across a seal could
miss the segment's lines (WARM_LINE_MISSING)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session

from engram.client import EngramRpcError
from engram.compactor.v1 import compactor_service_pb2 as pb
from services.common.blobstore.file import FileBlobStore
from services.compactor.domain.model import SnapshotInfo
from services.compactor.repository import CompactorRepository
from services.compactor.tables import HotRow, RunRow, WarmLineRow
from tests.integration.compactor.conftest import CompactorFactory
from tests.integration.compactor.test_compactor_contract import iteration

RUN = "run-live"
ITERATIONS = 300  # the fixture seals every ~2 KB and snapshots every 5: dozens of each


def test_verify_and_reads_of_a_run_being_appended_to_see_no_problem(
        compactor_for: CompactorFactory) -> None:
    writer, reader = compactor_for(), compactor_for()
    writer.record(RUN, iteration(1))
    done = threading.Event()
    errors: list[BaseException] = []

    def append() -> None:
        try:
            for n in range(2, ITERATIONS + 1):
                writer.record(RUN, iteration(n))
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=append)
    thread.start()
    problems, incomplete, verified = [], [], 0
    while not done.is_set():
        report = reader.verify(RUN)
        verified += 1
        if not report.ok:
            problems.append([(p.location, p.detail) for p in report.problems])
        seen = [s.iteration for s in reader.summaries(RUN)]
        if seen != list(range(1, len(seen) + 1)):
            incomplete.append(sorted(set(range(1, max(seen) + 1)) - set(seen)))
    thread.join(timeout=60)
    assert not errors
    assert verified > 5  # the reads overlapped the appends
    assert not problems, f"{len(problems)} of {verified} verifications: {problems[:3]}"
    assert not incomplete, f"summaries missing lines: {incomplete[:3]}"
    final = reader.verify(RUN)
    assert final.ok and final.last_iteration == ITERATIONS and final.segments_checked > 10


def test_finding_a_match_skips_files_deleted_since_they_were_listed(
        compactor_for: CompactorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`engram forget --match` scans every file of a run; a seal deletes the older index and a
    retirement a cold snapshot between the listing and the read. Such a file is gone, not an
    error: the scan used to end NOT_FOUND BLOB_NOT_FOUND on a fleet with a live run."""
    writer = compactor_for()
    for n in range(1, 31):
        writer.record(RUN, iteration(n))
    listed = FileBlobStore.list

    def with_a_file_gone(self: FileBlobStore, prefix: str = "") -> Iterator[str]:
        yield f"{prefix}cold/0000000001.json.gz"  # listed, then deleted before it is read
        yield from listed(self, prefix)

    monkeypatch.setattr(FileBlobStore, "list", with_a_file_gone)
    governor = compactor_for("gov-1", roles=("governor",))
    assert [log.run_id for log in governor.find_iteration_logs("step 29 ").runs] == [RUN]
    assert list(governor.find_iteration_logs("no such text anywhere").runs) == []


def test_a_reconstruction_whose_base_snapshot_was_just_retired_chooses_again(
        compactor_for: CompactorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reconstruct picks the newest stored snapshot at or before the iteration, then reads its
    file; a retirement between the two deletes it. That snapshot is gone, the iteration is not:
    it used to answer NOT_FOUND BLOB_NOT_FOUND."""
    writer = compactor_for()
    for n in range(1, 31):
        writer.record(RUN, iteration(n))
    chosen = CompactorRepository.stored_snapshot_at_or_before
    calls = []

    def retired_at_first(self: CompactorRepository, fleet_id: str, run_id: str,
                         at: int) -> SnapshotInfo | None:
        calls.append(at)
        real = chosen(self, fleet_id, run_id, at)
        if len(calls) == 1 and real is not None:  # the one chosen first is retired meanwhile
            return replace(real, key=real.key.replace(".json.gz", "-retired.json.gz"))
        return real

    monkeypatch.setattr(CompactorRepository, "stored_snapshot_at_or_before", retired_at_first)
    view = writer.reconstruct(RUN, 23)
    assert view.source == pb.DETAIL_SOURCE_BASE_SNAPSHOT and view.base_iteration == 20
    assert json.loads(view.detail_json)["n"] == 20 and len(calls) == 3


def test_a_pin_and_appends_that_trim_the_hot_ring_do_not_strand_the_runs_tier_work(
        compactor_for: CompactorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pin of a hot iteration reads the hot row, then records a pending snapshot of it. An
    append trimming that row in between left a pending snapshot whose detail was gone: the pin
    answered DATA_LOSS SNAPSHOT_DETAIL_MISSING and every later seal, snapshot and retirement of
    the run failed behind it. The pin now holds the run as an append does."""
    writer, pinner = compactor_for(), compactor_for()
    for n in range(1, 31):  # the hot ring (4) holds 27..30; 30 has its own snapshot
        writer.record(RUN, iteration(n))
    real_get = Session.get
    appended = threading.Event()

    def get_then_appends(self: Session, entity: object, ident: object, **kw: object) -> object:
        found = real_get(self, entity, ident, **kw)
        if entity is HotRow and not appended.is_set():
            appended.set()
            more = threading.Thread(target=lambda: [writer.record(RUN, iteration(n))
                                                    for n in range(31, 35)])
            more.start()
            more.join(timeout=1.5)  # they trim 27..30 unless the pin holds the run
        return found

    monkeypatch.setattr(Session, "get", get_then_appends)
    pin = pinner.pin(RUN, 27, "the oldest hot iteration, while appends go on")
    monkeypatch.undo()
    assert appended.is_set() and pin.snapshot_iteration == 27
    deadline = time.monotonic() + 30
    while writer.verify(RUN).last_iteration < 34 and time.monotonic() < deadline:
        time.sleep(0.05)
    writer.record(RUN, iteration(35))  # the run's tier work goes on
    report = writer.verify(RUN)
    assert report.ok, list(report.problems)
    assert json.loads(writer.reconstruct(RUN, 27).detail_json)["n"] == 27


def test_an_iteration_log_erased_while_it_is_read_is_not_found_not_data_loss(
        compactor_for: CompactorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """GetIteration reads the run's head, then the line: a ForgetIterations committing in
    between left no line, which was reported DATA_LOSS WARM_LINE_MISSING."""
    writer = compactor_for()
    for n in range(1, 4):
        writer.record(RUN, iteration(n))
    warm_lines = CompactorRepository.warm_lines

    def erased_first(self: CompactorRepository, fleet_id: str, run_id: str,
                     *args: Any) -> Any:
        with self.db.session() as session:  # the erasure's rows, committed first
            for table in (WarmLineRow, HotRow, RunRow):
                session.execute(delete(table).where(table.run_id == run_id))
        return warm_lines(self, fleet_id, run_id, *args)

    monkeypatch.setattr(CompactorRepository, "warm_lines", erased_first)
    with pytest.raises(EngramRpcError) as caught:
        writer.reconstruct(RUN, 2)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND, caught.value


def test_finding_a_match_does_not_look_in_salts_and_hashes(
        compactor_for: CompactorFactory) -> None:
    """Warm lines carry a random salt, hex commitments and hashes: a short number or hex
    fragment sought by `engram forget --match` was found in them, so a search for ``4711``
    named runs whose iterations never held it (and --whole-runs erased them)."""
    writer = compactor_for()
    for n in range(1, 31):  # sealed segments, cold snapshots, warm lines and the hot ring
        writer.record(RUN, iteration(n))
    lines = list(writer.summaries(RUN))
    fragments = {"salt of a sealed line": lines[0].salt[10:22],
                 "salt of a hot line": lines[-1].salt[10:22],
                 "commitment": lines[3].summary_commitment[5:17],
                 "detail digest": lines[12].detail_digest[5:17],
                 "hash": lines[20].hash[5:17], "prev hash": lines[28].prev_hash[5:17]}
    governor = compactor_for("gov-1", roles=("governor",))
    found = {what: [log.run_id for log in governor.find_iteration_logs(text).runs]
             for what, text in fragments.items()}
    assert found == {what: [] for what in fragments}
    assert [log.run_id for log in governor.find_iteration_logs("step 29 ").runs] == [RUN]
    assert [log.run_id for log in governor.find_iteration_logs("plan-3").runs] == [RUN]
    assert [log.run_id for log in governor.find_iteration_logs("2025-08-14T12:01:07").runs
            ] == [RUN]
