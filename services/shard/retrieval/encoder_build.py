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

import os
import pickle
import subprocess
import sys
from pathlib import Path

from services.shard.retrieval.model_dir import ModelDirError, ModelSpec

REFUSED_PREFIX = "ModelDirError: "
BUILD_TIMEOUT_SECONDS = 900.0
"""The mpnet profile's build (float graph, quantization, check) takes about a minute here."""


def build_apart(spec: ModelSpec, int8: bool, out: Path) -> None:
    """Write ``spec``'s encoder (int8-quantized with ``int8``) to ``out`` from a child process."""
    spec_file = out.with_name(out.name + ".spec")
    spec_file.write_bytes(pickle.dumps(spec))
    root = str(Path(__file__).resolve().parents[3])  # the directory holding ``services``
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", __name__, str(spec_file), str(out)]
    try:
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


def main(argv: list[str]) -> int:
    from services.shard.retrieval.embedding_onnx import build_encoder_file

    spec_file, out = Path(argv[0]), Path(argv[1])
    spec = pickle.loads(spec_file.read_bytes())
    if not isinstance(spec, ModelSpec):
        print(f"{spec_file} holds no model spec", file=sys.stderr)
        return 2
    try:
        build_encoder_file(spec, "--int8" in argv[2:], out)
    except ModelDirError as error:
        print(f"{REFUSED_PREFIX}{error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
