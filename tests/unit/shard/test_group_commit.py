from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from services.common.group_commit import GroupCommit


def test_concurrent_jobs_share_groups_and_all_get_their_result() -> None:
    groups: list[int] = []
    gate = threading.Event()

    def apply(jobs: Sequence[int]) -> list[int]:
        groups.append(len(jobs))
        gate.wait(0.05)
        return [job * 2 for job in jobs]

    committer: GroupCommit[int, int] = GroupCommit(apply)
    results: dict[int, int] = {}

    def worker(n: int) -> None:
        results[n] = committer.submit(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {n: n * 2 for n in range(40)}
    assert sum(groups) == 40
    assert len(groups) < 40  # some jobs were committed together


def test_a_failing_job_does_not_fail_its_group() -> None:
    def apply(jobs: Sequence[int]) -> list[int]:
        if 13 in jobs:
            raise ValueError("bad job")
        return list(jobs)

    committer: GroupCommit[int, int] = GroupCommit(apply)
    outcomes: dict[int, object] = {}

    def worker(n: int) -> None:
        try:
            outcomes[n] = committer.submit(n)
        except ValueError as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(10, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert isinstance(outcomes[13], ValueError)
    assert all(outcomes[n] == n for n in range(10, 20) if n != 13)


def test_single_caller_leads_itself() -> None:
    committer: GroupCommit[str, str] = GroupCommit(lambda jobs: [j.upper() for j in jobs])
    assert committer.submit("a") == "A"
    with pytest.raises(ZeroDivisionError):
        GroupCommit(lambda jobs: [1 // 0 for _ in jobs]).submit(1)


def test_submit_all_applies_many_jobs_beside_single_submitters() -> None:
    """Batches larger than a group, from several threads, mixed with single jobs and a job that
    fails alone: every job gets its own result or error, in order, and none is lost."""
    groups: list[int] = []

    def apply(jobs: Sequence[int]) -> list[int]:
        if -1 in jobs:
            raise ValueError("bad job")
        groups.append(len(jobs))
        threading.Event().wait(0.002)
        return [job * 2 for job in jobs]

    committer: GroupCommit[int, int] = GroupCommit(apply, max_group=7)
    batches: dict[int, list[int | BaseException]] = {}
    singles: dict[int, int] = {}

    def batch_worker(n: int) -> None:
        jobs = [n * 100 + i for i in range(25)] + ([-1] if n == 2 else [])
        batches[n] = committer.submit_all(jobs)

    def single_worker(n: int) -> None:
        singles[n] = committer.submit(10_000 + n)

    threads = [threading.Thread(target=batch_worker, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=single_worker, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    for n in range(4):
        expected: list[object] = [(n * 100 + i) * 2 for i in range(25)]
        assert batches[n][:25] == expected
    assert isinstance(batches[2][25], ValueError)
    assert singles == {n: (10_000 + n) * 2 for n in range(20)}
    assert max(groups) <= 7
    assert committer.submit_all([]) == []
    assert committer.submit_all([3]) == [6]  # alone: its own leader


def test_an_apply_that_loses_count_fails_its_group_and_strands_nobody() -> None:
    committer: GroupCommit[int, int] = GroupCommit(lambda jobs: [1] * (len(jobs) + 1),
                                                   max_group=3)
    answers = committer.submit_all(list(range(7)))
    assert all(isinstance(a, RuntimeError) for a in answers), answers
    later: list[BaseException] = []

    def submit_later() -> None:  # hung forever when a failed group left the queue led
        try:
            committer.submit(1)
        except RuntimeError as error:
            later.append(error)

    thread = threading.Thread(target=submit_later)
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and len(later) == 1


def test_a_group_whose_outcome_is_unknown_is_not_tried_again_job_by_job() -> None:
    """A connection lost during the commit may have committed the group: trying each job again
    alone recorded any job without a key of its own twice (found by review, 2026-11-30). With
    ``alone_after`` saying no, every job of the group gets the failure instead."""
    applied: list[list[int]] = []
    held = threading.Event()

    class LostAcknowledgement(Exception):
        pass

    def apply(jobs: Sequence[int]) -> list[int]:
        applied.append(list(jobs))
        if jobs == [0]:  # the first leads alone: held until the others queue behind it
            assert held.wait(10)
            return [0]
        raise LostAcknowledgement()

    committer: GroupCommit[int, int] = GroupCommit(
        apply, alone_after=lambda error: not isinstance(error, LostAcknowledgement))
    outcomes: dict[int, object] = {}

    def worker(n: int) -> None:
        try:
            outcomes[n] = committer.submit(n)
        except LostAcknowledgement as error:
            outcomes[n] = error

    first = threading.Thread(target=worker, args=(0,))
    first.start()
    _until(lambda: bool(applied), "the first job was never applied")
    others = [threading.Thread(target=worker, args=(n,)) for n in (1, 2, 3)]
    for thread in others:
        thread.start()
    _until(lambda: len(committer._queue) == 3, "the other jobs never queued")
    held.set()
    for thread in (first, *others):
        thread.join(10)
    assert applied == [[0], [1, 2, 3]], "the group's jobs were tried again alone"
    assert outcomes[0] == 0
    assert all(isinstance(outcomes[n], LostAcknowledgement) for n in (1, 2, 3))


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
