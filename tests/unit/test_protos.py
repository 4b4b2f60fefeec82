"""The committed stubs are exactly what `make protos` generates, and buf lint passes."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_do_not_drift(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert generated, "no stubs generated"
    drifted = [
        str(rel)
        for rel in generated
        if not (ROOT / rel).exists() or not filecmp.cmp(tmp_path / rel, ROOT / rel, shallow=False)
    ]
    assert not drifted, f"stubs differ from protos/: run `make protos` ({drifted})"
    committed = sorted(p.relative_to(ROOT) for p in (ROOT / "engram").rglob("*_pb2*.py*"))
    assert committed == generated, "stale stubs without a .proto"


def test_buf_lint_standard() -> None:
    buf = shutil.which("buf", path=str(Path(sys.executable).parent))
    if buf is None:
        pytest.fail("buf is not installed in the virtualenv (buf-bin is a dev dependency)")
    result = subprocess.run([buf, "lint"], cwd=ROOT / "protos", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
