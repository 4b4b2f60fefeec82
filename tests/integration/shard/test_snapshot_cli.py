"""`engram snapshot RUN` prints each record of the run as it streams (it gathered them all
first), and --json gives one document with all of them; `engram verify --gate` of the whole
fleet reconciles with a progress bar (it ran silently)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from engram.cli.main import app
from engram.client import ShardClient
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import cli_for
from tests.stack import full_stack


def test_a_run_snapshot_prints_each_record_and_its_verdict(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    agent = make_token("scout-1", "fleet-a")
    with full_stack(tmp_path / "data", engram_home, make_token) as stack:
        with ShardClient(stack.shard.address, agent) as shard:
            ids = [shard.add(f"note {n} of the run", run_id="run-s").record.id for n in range(3)]
        with cli_for(stack, agent, monkeypatch) as run:
            document = run("snapshot", "run-s")
            printed = CliRunner().invoke(app, ["snapshot", "run-s"])
        with cli_for(stack, make_token("op", "fleet-a", ("admin",)), monkeypatch):
            reconciled = CliRunner().invoke(app, ["verify", "--gate"])
    assert (document["count"], document["verified"]) == (3, True)
    assert sorted(r["id"] for r in document["records"]) == sorted(ids)
    assert printed.exit_code == 0, printed.output
    lines = printed.output.splitlines()
    assert sorted(line.split()[0] for line in lines[:3]) == sorted(ids)
    assert lines[3] == "3 records in run 'run-s', all verified"
    assert reconciled.exit_code == 0, reconciled.output
    assert "reconciled 3 records with governance's gate decisions: every one allowed" in \
        " ".join(reconciled.output.split())
