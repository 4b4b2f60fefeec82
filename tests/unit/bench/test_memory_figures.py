"""RSS and PSS of a process tree, as the benches report them (engram bench chroma)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engram.bench._harness import pss_mb, rss_mb

# A parent and a forked child sharing 64 MiB the parent wrote before the fork: RSS counts
# those pages in both, PSS half in each.
_SHARED = """
import os, sys, time
block = bytearray(64 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
if os.fork() == 0:
    time.sleep(30)
    os._exit(0)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_pss_counts_the_pages_a_tree_shares_once() -> None:
    with subprocess.Popen([sys.executable, "-c", _SHARED], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as parent:
        try:
            assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
            rss, pss = rss_mb(parent.pid), pss_mb(parent.pid)
            assert rss >= 128, rss  # the 64 MiB in each process
            assert 64 <= pss <= rss - 48, (pss, rss)  # once, and a little of each's own
        finally:
            subprocess.run(["pkill", "-KILL", "-P", str(parent.pid)], check=False)
            parent.kill()


def test_pss_of_a_process_gone_is_nothing() -> None:
    assert pss_mb(2**22 + 1) == 0.0  # no such pid: nothing, not an error


def test_pss_not_readable_is_no_figure_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without smaps_rollup (before 4.14) or a sandbox that refuses it: None, which
    the bench leaves out, not 0 (a review found 0 dividing Chroma's figure)."""
    real_open = open

    def refused(path: str, *args: object, **kwargs: object) -> object:
        if str(path).endswith("smaps_rollup"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", refused)
    assert pss_mb() is None
