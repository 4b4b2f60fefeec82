"""Send one request from many threads at once: every caller must get the first call's answer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

THREADS = 12


def at_once(call: Callable[[], T], threads: int = THREADS) -> list[T | BaseException]:
    """``call`` from ``threads`` threads released together; each result or the exception."""
    barrier = threading.Barrier(threads)

    def one() -> T | BaseException:
        barrier.wait()
        try:
            return call()
        except Exception as error:
            return error

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: one(), range(threads)))
