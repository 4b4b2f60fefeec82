"""The encoder's builder process (encoder_build) goes with the process waiting for it, and the
scratch directories of killed builds are removed by a later one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.shard.retrieval.encoder_build import sweep_stale_scratch

ROOT = Path(__file__).resolve().parents[3]


def _builders(mark: str) -> list[int]:
    """Running encoder_build processes whose command line names ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (argv[1:3] == ["-m", "services.shard.retrieval.encoder_build"]
                and mark in " ".join(argv) and state != "Z"):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_the_builder_dies_with_the_process_waiting_for_it(tmp_path: Path) -> None:
    """Found by review: a killed embedder process left its builder running (up to its timeout,
    ~550 MB for the int8 MiniLM), and a crash-looping shard piled them up."""
    hook = tmp_path / "hook"
    hook.mkdir()  # a slow build
    (hook / "sitecustomize.py").write_text(  # the build's first import takes two minutes
        "import builtins, sys, time\n"
        "if 'services.shard.retrieval.encoder_build' in sys.orig_argv:\n"
        "    real = builtins.__import__\n"
        "    def slow(name, *args, **kwargs):\n"
        "        if name == 'services.shard.retrieval.embedding_onnx':\n"
        "            time.sleep(120)\n"
        "        return real(name, *args, **kwargs)\n"
        "    builtins.__import__ = slow\n")
    waiting = textwrap.dedent(f"""
        import tempfile
        from pathlib import Path
        from services.shard.retrieval.embedding import minilm_spec
        from services.shard.retrieval.encoder_build import build_apart
        with tempfile.TemporaryDirectory(prefix="engram-encoder-", dir={str(tmp_path)!r}) as d:
            build_apart(minilm_spec(), True, Path(d) / "encoder.onnx")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)])}
    parent = subprocess.Popen([sys.executable, "-c", waiting], cwd=ROOT, env=env)
    builder = None
    try:
        deadline = time.monotonic() + 30
        while builder is None and time.monotonic() < deadline:
            builder = next(iter(_builders(str(tmp_path))), None)
            time.sleep(0.1)
        assert builder is not None, "the builder never started"
        parent.send_signal(signal.SIGKILL)  # as EmbeddingProcess.close() kills a late child
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while builder in _builders(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert builder not in _builders(str(tmp_path)), "the builder outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _builders(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)


def test_scratch_left_by_killed_builds_is_removed_and_fresh_scratch_kept(
        tmp_path: Path) -> None:
    stale, fresh = tmp_path / "engram-encoder-old", tmp_path / "engram-encoder-new"
    other = tmp_path / "someone-elses-old-dir"
    for directory in (stale, fresh, other):
        directory.mkdir()
        (directory / "encoder.onnx").write_bytes(b"partial graph")
    hour_ago = time.time() - 2 * 3600
    os.utime(stale, (hour_ago, hour_ago))
    os.utime(other, (hour_ago, hour_ago))
    assert sweep_stale_scratch(tmp_path) == 1
    assert not stale.exists() and fresh.exists() and other.exists()
