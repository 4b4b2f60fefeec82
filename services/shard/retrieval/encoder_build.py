"""Build an encoder's ONNX file in a process of its own, so the one that serves it stays small.

Building the graph imports ``onnx`` and holds the float32 weights, the float graph and the
quantizer's copies (the int8 MiniLM peaks near 550 MB); glibc keeps much of that in the
process even after a heap trim, and the ``onnx`` package stays imported. The embedder
process (and a shard embedding in-process) runs this module instead, waits for the file,
and loads only the finished graph into ONNX Runtime: with the int8 MiniLM at 10k records
the embedder process held 161 MB instead of 184, and peaked at 195 MB instead of 545 during
its start (2026-11-28; docs/retrieval.md, "Memory").

Run as ``python -m services.shard.retrieval.encoder_build SPEC OUT [--int8]``, where SPEC
is a pickled :class:`ModelSpec` written by :func:`build_apart` into its own temporary
directory. A model the builder refuses (``ModelDirError``) comes back as that error, its
message unchanged; any other failure as a ``RuntimeError`` with the builder's last words.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.shard.retrieval.model_dir import ModelDirError, ModelSpec

REFUSED_PREFIX = "ModelDirError: "
BUILD_TIMEOUT_SECONDS = 280.0
"""Below the 300 s the shard waits for its embedder process to say it is ready (a build that
takes longer would be killed with that process anyway)."""
SCRATCH_PREFIX = "engram-encoder-"
STALE_SCRATCH_SECONDS = 3600.0
"""A scratch directory this old is a killed build's (a build lasts minutes at most)."""
_PR_SET_PDEATHSIG = 1


def build_apart(spec: ModelSpec, int8: bool, out: Path) -> None:
    """Write ``spec``'s encoder (int8-quantized with ``int8``) to ``out`` from a child process
    that dies with this one (a builder left behind held ~550 MB for minutes), after removing
    the scratch directories earlier builds that were killed left in ``out``'s parent's
    directory."""
    sweep_stale_scratch(out.parent.parent)
    spec_file = out.with_name(out.name + ".spec")
    spec_file.write_bytes(pickle.dumps(spec))
    root = str(Path(__file__).resolve().parents[3])  # the directory holding ``services``
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", __name__, str(spec_file), str(out), str(os.getpid())]
    try:
        # No preexec_fn: it makes subprocess fork() instead of vfork(), and gRPC's fork
        # handlers then abort the child of a process serving gRPC (seen in CI, exit -6).
        done = subprocess.run(command + (["--int8"] if int8 else []), env=env,
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS,
                              check=False)
    finally:
        spec_file.unlink(missing_ok=True)
    if done.returncode == 0 and out.is_file():
        return
    refused = done.stderr.rpartition(REFUSED_PREFIX)
    if refused[1]:
        raise ModelDirError(refused[2].strip())
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"building the {spec.name} encoder failed (exit {done.returncode}): {last}")


def die_with_parent(parent: int) -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent goes
    (``prctl(PR_SET_PDEATHSIG)``; the parent's thread waits in ``subprocess.run`` meanwhile),
    and leave at once if ``parent`` went before the request was made (we were re-parented)."""
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # not glibc: the parent check below still holds
            pass
    if os.getppid() != parent:
        os._exit(3)


def sweep_stale_scratch(directory: Path, older_than: float = STALE_SCRATCH_SECONDS) -> int:
    """Remove the ``engram-encoder-*`` directories under ``directory`` older than
    ``older_than`` seconds (a killed embedder's: a 58 MB graph each); how many went."""
    removed, now = 0, time.time()
    for scratch in directory.glob(SCRATCH_PREFIX + "*"):
        try:
            if scratch.is_dir() and now - scratch.stat().st_mtime > older_than:
                shutil.rmtree(scratch, ignore_errors=True)
                removed += 1
        except OSError:  # removed meanwhile
            continue
    return removed


def main(argv: list[str]) -> int:
    die_with_parent(int(argv[2]))  # before the build's imports and its minutes of work
    from services.shard.retrieval.embedding_onnx import build_encoder_file

    spec_file, out = Path(argv[0]), Path(argv[1])
    spec = pickle.loads(spec_file.read_bytes())
    if not isinstance(spec, ModelSpec):
        print(f"{spec_file} holds no model spec", file=sys.stderr)
        return 2
    try:
        build_encoder_file(spec, "--int8" in argv[3:], out)
    except ModelDirError as error:
        print(f"{REFUSED_PREFIX}{error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
