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


_ARENAS_PROBE = """
import ctypes, threading
from services.common.memory import limit_arenas
print(limit_arenas())
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.open_memstream.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
start, hold = threading.Barrier(9), threading.Event()
def worker():
    start.wait()
    libc.malloc(1000)  # a thread's first malloc takes an arena: a new one while under the cap
    hold.wait()
threads = [threading.Thread(target=worker) for _ in range(8)]
for thread in threads:
    thread.start()
start.wait()
buf, size = ctypes.c_char_p(), ctypes.c_size_t()
stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
libc.malloc_info(0, stream)
libc.fclose(stream)
print(buf.value.decode().count("<heap nr="))
hold.set()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
@pytest.mark.parametrize("environ", [{}, {"MALLOC_ARENA_MAX": "1"}])
def test_threads_share_a_capped_number_of_malloc_arenas(environ: dict[str, str]) -> None:
    """Eight threads that allocate at once get glibc's default of an arena each; a service
    caps them at ARENAS, and an operator's MALLOC_ARENA_MAX still decides when it is set."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | environ
    done = subprocess.run([sys.executable, "-c", _ARENAS_PROBE], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    applied, arenas = done.stdout.split()
    if environ:
        assert (applied, int(arenas)) == ("None", 1)
    else:
        assert (applied, int(arenas)) == ("2", 2), "glibc gives each thread its own arena"
