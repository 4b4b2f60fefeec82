"""Group commit: concurrent writers share one transaction and one fsync.

The first writer to arrive becomes the leader and applies everything queued
behind it in one transaction; the others wait for their result. An
uncontended write pays no hand-off (the caller is its own leader), and under
load the cost of a durable commit is spread over the whole group. When a
group fails as a whole, each job is retried alone so one bad job cannot fail
its neighbours, unless the failure is one after which the group's outcome is
unknown (``alone_after``): a connection lost during the commit may have
committed it, and retrying a job that has no key of its own records it twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass
class _Slot(Generic[Job, Result]):
    """One waiting job; ``wake`` is held until its result (or leadership) is handed over.

    A bare lock instead of an Event: under 64 writers in flight, creating and setting an
    Event (a Condition and its waiter list) per job was ~7% of a write's CPU.
    """

    job: Job
    done: bool = False
    result: Result | None = None
    error: BaseException | None = None
    wake: threading.Lock = field(default_factory=_held_lock)


class GroupCommit(Generic[Job, Result]):
    def __init__(
        self, apply: Callable[[Sequence[Job]], list[Result]], max_group: int = 256, *,
        alone_after: Callable[[BaseException], bool] = lambda _error: True,
    ) -> None:
        """``alone_after(error)``: whether the jobs of a group that failed with ``error`` are
        each tried again alone (else every one of them fails with it)."""
        self._apply = apply
        self._max_group = max_group
        self._alone_after = alone_after
        self._lock = threading.Lock()
        self._queue: list[_Slot[Job, Result]] = []
        self._leading = False

    def _enqueue(self, slots: list[_Slot[Job, Result]]) -> bool:
        """Queue ``slots``; whether the caller must lead (no group is being applied)."""
        with self._lock:
            self._queue.extend(slots)
            lead = not self._leading
            if lead:
                self._leading = True
        return lead

    def submit(self, job: Job) -> Result:
        slot: _Slot[Job, Result] = _Slot(job)
        lead = self._enqueue([slot])
        if not lead:
            slot.wake.acquire()
            if not slot.done:
                return self._lead_after_wait(slot)
            return self._unwrap(slot)
        self._lead()
        return self._unwrap(slot)

    def submit_all(self, jobs: Sequence[Job]) -> list[Result | BaseException]:
        """Several jobs at once, each applied as if submitted alone (in this order, in one
        group when they fit): a job's result, or the error it alone failed with."""
        slots: list[_Slot[Job, Result]] = [_Slot(job) for job in jobs]
        if not slots:
            return []
        if self._enqueue(slots):
            self._lead()
        for slot in slots:
            # Released when its group is done, or handed leadership (it is then the oldest
            # waiting job, so every slot before it is done): lead its group.
            slot.wake.acquire()
            if not slot.done:
                self._lead()
        return [slot.error if slot.error is not None else slot.result  # type: ignore[misc]
                for slot in slots]

    def _lead_after_wait(self, slot: _Slot[Job, Result]) -> Result:
        self._lead()
        return self._unwrap(slot)

    def _lead(self) -> None:
        with self._lock:
            group = self._queue[: self._max_group]
            del self._queue[: len(group)]
        try:
            self._run(group)
        finally:
            with self._lock:
                if self._queue:
                    # Hand leadership to the oldest waiter; it wakes up not done and leads.
                    self._queue[0].wake.release()
                else:
                    self._leading = False
            # Every slot's lock is held here (since its creation, or by the leader that woke
            # on it); releasing it wakes a waiting job and is a no-op for the leader's own.
            for slot in group:
                slot.wake.release()

    def _run(self, group: list[_Slot[Job, Result]]) -> None:
        try:
            results = self._apply([slot.job for slot in group])
        except BaseException as exc:
            if len(group) == 1 or not self._alone_after(exc):
                for slot in group:
                    slot.error, slot.done = exc, True
                return
            for slot in group:
                try:
                    slot.result = self._apply([slot.job])[0]
                except BaseException as single_exc:
                    slot.error = single_exc
                slot.done = True
            return
        if len(results) != len(group):  # an apply that lost count answers nobody wrongly
            wrong = RuntimeError(f"group commit: {len(results)} results for {len(group)} jobs")
            for slot in group:
                slot.error, slot.done = wrong, True
            return
        for slot, result in zip(group, results, strict=True):
            slot.result, slot.done = result, True

    @staticmethod
    def _unwrap(slot: _Slot[Job, Result]) -> Result:
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]
