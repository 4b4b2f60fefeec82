"""Reads of a run that is being appended to: a seal (lines leave the database for a segment
file, an older index is deleted) or a snapshot's retirement committed between two of a read's
queries must not look like a broken or incomplete warm log. SQLite and Postgres.

Before each read took one snapshot, VerifyRun reported "the run's head is iteration N; the warm
log ends at N+1" (head read before the lines) on a live run, and a read across a seal could
miss the segment's lines (WARM_LINE_MISSING)."""

from __future__ import annotations

import threading

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
