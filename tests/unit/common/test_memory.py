"""trim_heap hands freed heap pages back to the OS (glibc)."""

from __future__ import annotations

import os
import sys

import pytest

from services.common.memory import trim_heap


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_freed_fragmented_heap_is_returned() -> None:
    # 100 KB blocks stay below glibc's mmap threshold, so they live on the heap; keeping
    # every tenth alive leaves the freed ones stranded between them (no automatic trim).
    blocks = [bytearray(100_000) for _ in range(2000)]
    kept = blocks[::10]
    del blocks
    before = _rss_mb()
    assert trim_heap()
    after = _rss_mb()
    assert before - after > 50, (before, after)  # ~180 MB were freed
    assert len(kept) == 200
