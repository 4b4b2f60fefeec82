"""Whole-store scans take one of a replica's two slots (services.common.erasure_source.TextScans):
the shared shape of the tests that hold two scans and see a third refused."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pytest

from engram.client import EngramRpcError

T = TypeVar("T")


class Held:
    """Wraps a step of a scan so that each call waits, once entered, until :meth:`release`."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.released = threading.Event()

    def wrap(self, step: Callable[..., T]) -> Callable[..., T]:
        def held(*args: Any, **kwargs: Any) -> T:
            self.entered.release()
            assert self.released.wait(30)
            return step(*args, **kwargs)

        return held

    def release(self) -> None:
        self.released.set()


def third_scan_is_busy(held: Held, scan: Callable[[], T], third: Callable[[], object],
                       meanwhile: Callable[[], None] = lambda: None,
                       enter_within: float = 30.0) -> list[T]:
    """Two ``scan`` calls run at once, each held inside (``held``) within ``enter_within``
    seconds; ``third`` meanwhile is RESOURCE_EXHAUSTED SCAN_BUSY, and ``meanwhile`` runs while
    they are held. Once released: the two scans' answers."""
    answers: list[T] = []
    running = [threading.Thread(target=lambda: answers.append(scan())) for _ in range(2)]
    for thread in running:
        thread.start()
    try:
        for _ in running:
            assert held.entered.acquire(timeout=enter_within)
        with pytest.raises(EngramRpcError) as busy:
            third()
        assert (busy.value.code, busy.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                         "SCAN_BUSY")
        meanwhile()
    finally:
        held.release()
        for thread in running:
            thread.join(30)
    return answers
