"""The committed stubs are exactly what `make protos` generates, and buf lint passes."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stubs(root: Path) -> list[Path]:
    """Generated sources under ``root`` (``.py`` and ``.pyi``; bytecode caches are not stubs)."""
    return sorted(p.relative_to(root) for p in root.rglob("*_pb2*.py*")
                  if p.suffix in {".py", ".pyi"})


def test_generated_stubs_do_not_drift(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    generated = _stubs(tmp_path)
    assert generated, "no stubs generated"
    drifted = [
        str(rel)
        for rel in generated
        if not (ROOT / rel).exists() or not filecmp.cmp(tmp_path / rel, ROOT / rel, shallow=False)
    ]
    assert not drifted, f"stubs differ from protos/: run `make protos` ({drifted})"
    committed = [Path("engram") / p for p in _stubs(ROOT / "engram")]
    assert committed == generated, "stale stubs without a .proto"


def test_buf_lint_standard() -> None:
    buf = shutil.which("buf", path=str(Path(sys.executable).parent))
    if buf is None:
        pytest.fail("buf is not installed in the virtualenv (buf-bin is a dev dependency)")
    result = subprocess.run([buf, "lint"], cwd=ROOT / "protos", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
