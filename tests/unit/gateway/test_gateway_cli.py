"""`engram gateway`: its options, and a missing extra said plainly."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from engram.cli.main import app


def test_help_names_the_options() -> None:
    result = CliRunner().invoke(app, ["gateway", "--help"])
    assert result.exit_code == 0
    assert "--host" in result.output and "--port" in result.output


def test_without_the_extra_it_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "engram.gateway" or n.startswith(
            ("engram.gateway.", "starlette"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)
    result = CliRunner().invoke(app, ["gateway", "--port", "0"])
    assert result.exit_code == 1
    assert "engram[gateway]" in result.output


def test_the_route_table_in_the_docs_is_generated_from_the_annotations() -> None:
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, str(root / "tools" / "gen_gateway_routes.py"),
                             "--check"], capture_output=True, text=True, check=False,
                            cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
