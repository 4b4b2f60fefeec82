"""`engram export` and `engram import-bundle` without --json draw a progress bar per part on
stderr (a terminal's), counting rows (bytes for blobs and verification) against the part's
total where it is known; with --json nothing but the JSON is printed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import engram.cli.bundle as bundle_command
from engram.cli.main import app
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for, populated_origin
from tests.stack import full_stack


def _terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """stderr as a 160-column terminal, kept in memory."""
    screen = io.StringIO()
    monkeypatch.setattr(bundle_command, "err_console",
                        Console(file=screen, force_terminal=True, width=160))
    return screen


def test_export_and_import_draw_a_bar_per_part(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", "fleet-a", ADMIN)
    bundle = tmp_path / "x.bundle"
    runner = CliRunner()
    with populated_origin(tmp_path, engram_home, make_token) as origin, \
            cli_for(origin, admin, monkeypatch):
        screen = _terminal(monkeypatch)
        done = runner.invoke(app, ["export", "--fleet", "fleet-a", "-o", str(bundle)])
        assert done.exit_code == 0, done.output
        drawn = screen.getvalue()
        assert "exporting records (rows)" in drawn and "14/14" in drawn
        assert "exporting blobs (bytes)" in drawn
    with full_stack(tmp_path / "b", engram_home, make_token) as target, \
            cli_for(target, admin, monkeypatch):
        screen = _terminal(monkeypatch)
        done = runner.invoke(app, ["import-bundle", str(bundle)])
        assert done.exit_code == 0, done.output
        drawn = screen.getvalue()
        assert "importing verifying (bytes)" in drawn
        assert "importing records (rows)" in drawn and "importing events (rows)" in drawn
        screen = _terminal(monkeypatch)  # --json: the JSON alone, no bar
        done = runner.invoke(app, ["import-bundle", str(bundle), "--json"])
        assert done.exit_code == 0, done.output
        assert screen.getvalue() == ""
        assert json.loads(done.stdout)["not_imported"] == {}
