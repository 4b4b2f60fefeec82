"""`engram query` / `engram list` filter options against a real shard, through the typer app."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import engram.cli._output as output
from engram.cli.main import app
from engram.client import ShardClient
from services.shard.service import ShardService
from tests.conftest import TokenFactory


@pytest.fixture
def cli(shard: tuple[str, ShardService], make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("ENGRAM_SHARD_ADDR", shard[0])
    monkeypatch.setenv("ENGRAM_TOKEN", make_token("alice", "fleet-a"))
    monkeypatch.setattr(output, "_settings", None)
    yield CliRunner()
    output._settings = None


def _ids(runner: CliRunner, *args: str) -> set[str]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    return {(item.get("record") or item)["id"] for item in found}


@pytest.mark.parametrize("shard_db_url", ["sqlite"], indirect=True)
def test_query_and_list_take_every_filter_option(cli: CliRunner, client: ShardClient) -> None:
    a = client.add("rollout plan for apollo", tags=["ops", "x"], metadata={"p": "apollo"},
                   importance=0.9).record
    b = client.add("rollout plan for gemini", tags=["docs"], metadata={"p": "gemini"},
                   importance=0.2).record
    after = a.create_time.ToJsonString()
    for command in (["query", "rollout plan"], ["list"]):
        assert _ids(cli, *command, "--meta", "p=apollo") == {a.id}
        assert _ids(cli, *command, "--tag-any", "docs,zzz") == {b.id}
        assert _ids(cli, *command, "--tag-all", "ops,x") == {a.id}
        assert _ids(cli, *command, "--author", "agent-1") == {a.id, b.id}
        assert _ids(cli, *command, "--author", "alice") == set()
        assert _ids(cli, *command, "--after", after) == {b.id}
        assert _ids(cli, *command, "--before", after) == set()
        assert _ids(cli, *command, "--min-importance", "0.5") == {a.id}
    for bad in (["--meta", "p>1"], ["--after", "2026-05-01"], ["--min-importance", "1.5"]):
        result = cli.invoke(app, ["query", "rollout", *bad])
        assert result.exit_code == 2, result.output
