"""`engram compactor …` against a real compactor server, through the typer app."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engram.cli._output as output
from engram.cli.compactor import app
from services.common.server import EngramServer
from tests.conftest import TokenFactory


@pytest.fixture
def cli(compactor_server: EngramServer, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("ENGRAM_COMPACTOR_ADDR", compactor_server.address)
    monkeypatch.setenv("ENGRAM_TOKEN", make_token("ops", "fleet-a", ("admin",)))
    monkeypatch.setattr(output, "_settings", None)
    yield CliRunner()
    output._settings = None


def _json(runner: CliRunner, *args: str) -> object:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("compactor_db_url", ["sqlite"], indirect=True)
def test_record_reconstruct_pin_verify_and_policies(cli: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "iterations.jsonl"
    path.write_text("".join(json.dumps({
        "iter": n, "planDigest": f"p{n}", "parentDigest": f"p{n - 1}",
        "startTs": "2025-08-14T12:00:00Z", "endTs": "2025-08-14T12:00:05Z", "filesTouched": 2,
        "netAdd": 5, "netDel": 1, "riskScore": 0.5, "status": "success",
        "detail": {"n": n}, "guardrails": {"lint": "ok"}}) + "\n" for n in range(1, 13)))
    recorded = _json(cli, "record", "cli-run", "--detail-file", str(path))
    assert [r["summary"]["iteration"] for r in recorded] == list(range(1, 13))
    view = _json(cli, "reconstruct", "cli-run", "5")
    assert view["source"] == "cold_snapshot" and view["detail"] == {"n": 5}
    assert _json(cli, "pin", "cli-run", "7", "--reason", "odd diff")["snapshot_iteration"] == 5
    assert len(_json(cli, "recent", "cli-run")) == 4
    assert len(_json(cli, "summaries", "cli-run", "--start", "10")) == 3
    assert _json(cli, "verify", "cli-run")["ok"] is True
    dry = _json(cli, "compact-memory", "--dry-run")
    assert dry["dry_run"] is True and dry["outcome"] == "succeeded"
    runs = _json(cli, "policy-runs")
    assert [r["id"] for r in runs] == [dry["id"]]
    missing = cli.invoke(app, ["reconstruct", "nope", "1", "--json"])
    assert missing.exit_code == 2 and json.loads(missing.stdout)["error"]["code"] == "NOT_FOUND"
