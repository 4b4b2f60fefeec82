"""`engram token create --ttl`, `inspect`, `revoke`, `rotate-key` and the tokens `engram up`
writes (lifetimes, audiences, renewal), against a real governance server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engram.cli import _output as cli_output
from engram.cli.main import app
from engram.cli.up import SERVICES, prepare_home, service_env
from engram.client.governance import GovernanceClient
from services.common.server import EngramServer
from services.common.tokens import (
    DEFAULT_SERVICE_TTL_SECONDS,
    TokenSigner,
    TokenVerifier,
    local_public_keys,
    write_token_file,
)
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from tests.conftest import TokenFactory, inspect_token


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("ENGRAM_HOME", str(home))
    monkeypatch.delenv("ENGRAM_TOKEN", raising=False)
    monkeypatch.setattr(cli_output, "_settings", None)
    return home


def _json(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    loaded: dict[str, object] = json.loads(result.stdout)
    return loaded


def test_engram_up_writes_expiring_least_audience_tokens_and_renews_them(home: Path) -> None:
    tokens = prepare_home(home)
    verifier = TokenVerifier.load(local_public_keys(home))
    audiences = {name: inspect_token(path.read_text().strip())["claims"]
                 for name, path in tokens.items()}
    assert audiences["admin"]["aud"] == ["artifacts", "compactor", "embedder", "governance",
                                         "shard"]
    assert audiences["shard"]["aud"] == ["embedder", "governance"]
    assert audiences["artifacts"]["aud"] == ["governance"]
    assert audiences["compactor"]["aud"] == ["artifacts", "governance", "shard"]
    for claims in audiences.values():
        assert claims["exp"] - claims["iat"] == DEFAULT_SERVICE_TTL_SECONDS
    assert verifier.verify(tokens["shard"].read_text().strip()).roles == {"service"}
    before = {name: path.read_text() for name, path in tokens.items()}
    assert {n: p.read_text() for n, p in prepare_home(home).items()} == before, "still fresh"

    key = TokenSigner.load(home / "auth" / "signing.key")
    write_token_file(tokens["shard"], TokenSigner(key._key, clock=lambda: time.time() - 25 * 86400)
                     .issue("svc-shard", "system", {"service"}, ttl_seconds=30 * 86400))
    after = prepare_home(home)
    renewed = after["shard"].read_text().strip()
    assert renewed != before["shard"].strip()
    assert verifier.verify(renewed).issued_at >= time.time() - 60, "renewed: 5 of 30 days left"
    assert after["admin"].read_text() == before["admin"]

    # A shard token minted before the embedder existed (aud governance alone) is written
    # again, so a shard can call a shared embedding service.
    write_token_file(tokens["shard"], key.issue("svc-shard", "system", {"service"},
                                                audience=("governance",),
                                                ttl_seconds=30 * 86400))
    widened = inspect_token(prepare_home(home)["shard"].read_text().strip())["claims"]
    assert widened["aud"] == ["embedder", "governance"]

    rotated = _json("token", "rotate-key")
    after = prepare_home(home)
    for name, path in after.items():
        assert inspect_token(path.read_text().strip())["header"]["kid"] == rotated[
            "signing_kid"], f"{name} was minted by the retired key and must be renewed"
    both = TokenVerifier.load(local_public_keys(home))
    assert both.key_ids == {rotated["signing_kid"], rotated["retired_kid"]}


def test_every_service_is_wired_to_governance(home: Path) -> None:
    for launch in SERVICES:
        env = service_env(launch, home, "127.0.0.1")
        if launch.name != "governance":
            assert env[f"ENGRAM_{launch.name.upper()}_GOVERNANCE_ADDR"].startswith("127.0.0.1:")
            assert env[f"ENGRAM_{launch.name.upper()}_SERVICE_TOKEN_FILE"]


def test_token_create_ttl_audience_and_inspect(home: Path) -> None:
    prepare_home(home)
    made = _json("token", "create", "--agent", "scout", "--fleet", "f1", "--ttl", "30m",
                 "--audience", "shard")
    claims = inspect_token(str(made["token"]))["claims"]
    assert claims["exp"] - claims["iat"] == 1800 and claims["aud"] == ["shard"]
    assert made["jti"] == claims["jti"]
    default = inspect_token(str(_json("token", "create", "--agent", "a", "--fleet", "f1")[
        "token"]))["claims"]
    assert default["exp"] - default["iat"] == 24 * 3600
    shown = _json("token", "inspect", str(made["token"]))
    assert shown["claims"]["sub"] == "scout"  # type: ignore[index]
    bad = CliRunner().invoke(app, ["token", "create", "--agent", "a", "--fleet", "f",
                                   "--ttl", "soon"])
    assert bad.exit_code != 0 and "duration" in bad.output


@pytest.fixture
def governance(tmp_path: Path, engram_home: Path) -> Iterator[EngramServer]:
    server = build_governance_server(GovernanceSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'gov.db'}"))
    server.start()
    yield server
    server.stop(0)


def test_token_revoke_by_token_and_by_agent(governance: EngramServer, make_token: TokenFactory,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_GOVERNANCE_ADDR", governance.address)
    monkeypatch.setenv("ENGRAM_TOKEN", make_token("ops", "fleet-a", ("governor",)))
    monkeypatch.setattr(cli_output, "_settings", None)
    leaked = make_token("agent-1", "fleet-a")
    revoked = _json("token", "revoke", "--token", leaked, "--reason", "pasted in a chat")
    assert revoked["created"] is True
    assert revoked["revoked"]["jti"] == inspect_token(leaked)["claims"]["jti"]  # type: ignore[index]
    assert revoked["revoked"]["agent_id"] == "agent-1"  # type: ignore[index]
    agent = _json("token", "revoke", "--agent", "agent-2")
    assert agent["agent_id"] == "agent-2" and agent["revoked_by"] == "ops"
    with GovernanceClient(governance.address,
                          make_token("svc-shard", "system", ("service",))) as service:
        listed = service.access_restrictions(0)
    assert {t.jti for t in listed.revoked_tokens} == {revoked["revoked"]["jti"]}  # type: ignore[index]
    assert [(a.fleet_id, a.agent_id) for a in listed.revoked_agents] == [("fleet-a", "agent-2")]
    neither = CliRunner().invoke(app, ["token", "revoke"])
    assert neither.exit_code == 1 and "exactly one" in neither.output
    monkeypatch.setenv("ENGRAM_TOKEN", make_token("agent-9", "fleet-a"))
    monkeypatch.setattr(cli_output, "_settings", None)
    refused = CliRunner().invoke(app, ["token", "revoke", "--agent", "agent-2"])
    assert refused.exit_code == 2 and "ROLE_REQUIRED" in refused.output
