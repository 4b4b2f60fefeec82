"""Background threads lower their own CPU priority and nobody else's."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from services.common.priority import lower_this_thread

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")


def _nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def _in_thread(niceness: int) -> tuple[bool, int, int]:
    """(lowered?, the thread's nice after, the caller's nice meanwhile)."""
    out: list[tuple[bool, int, int]] = []
    caller = threading.get_native_id()

    def body() -> None:
        done = lower_this_thread(niceness)
        out.append((done, _nice_of(threading.get_native_id()), _nice_of(caller)))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return out[0]


@linux_only
def test_raises_only_the_calling_threads_nice_value() -> None:
    before = _nice_of(threading.get_native_id())
    done, thread_nice, caller_nice = _in_thread(5)
    assert done
    assert thread_nice == min(19, before + 5)
    assert caller_nice == before  # the request threads keep their priority
    assert _nice_of(threading.get_native_id()) == before


@linux_only
def test_a_thread_started_by_a_lowered_one_is_not_lowered_twice() -> None:
    base = _nice_of(os.getpid())
    seen: list[int] = []

    def child() -> None:
        lower_this_thread(3)
        seen.append(_nice_of(threading.get_native_id()))

    def parent() -> None:
        lower_this_thread(3)
        inner = threading.Thread(target=child)  # inherits the parent's lowered value
        inner.start()
        inner.join()

    outer = threading.Thread(target=parent)
    outer.start()
    outer.join()
    assert seen == [min(19, base + 3)]


@linux_only
def test_caps_at_the_lowest_priority() -> None:
    done, thread_nice, _ = _in_thread(100)
    assert done and thread_nice == 19


def test_zero_leaves_the_thread_alone() -> None:
    done, thread_nice, caller_nice = _in_thread(0)
    assert not done and thread_nice == caller_nice
