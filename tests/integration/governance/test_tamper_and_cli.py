"""`engram gov` on a live server; a tampered row is found; a broken chain stops service."""

from __future__ import annotations

import json
import time

import grpc
import pytest
import sqlalchemy
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner

import engram.cli._output as cli_output
from engram.cli.gov import app
from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.db import normalize_url
from services.common.server import EngramServer
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from tests.conftest import TokenFactory


@pytest.fixture
def gov_cli(governance: EngramServer, make_token: TokenFactory,
            monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("ENGRAM_GOVERNANCE_ADDR", governance.address)
    monkeypatch.setenv("ENGRAM_TOKEN", make_token("ops", "fleet-a", ("governor",)))
    monkeypatch.setattr(cli_output, "_settings", None)
    return CliRunner()


def _run(runner: CliRunner, *args: str) -> tuple[int, object]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else None


def test_cli_commands(gov_cli: CliRunner, shard_service: GovernanceClient) -> None:
    code, trust = _run(gov_cli, "tier", "agent-7", "probation", "--reason", "new")
    assert code == 0 and trust["tier"] == "probation"  # type: ignore[index]
    code, trust = _run(gov_cli, "suspend", "agent-7")
    assert code == 0 and trust["multiplier"] == 0.0  # type: ignore[index]
    code, added = _run(gov_cli, "rules", "add", "--deny-pattern", "drop table",
                       "--tier", "standard")
    rule_id = added["rule"]["rule_id"]  # type: ignore[index]
    assert code == 0 and added["created"]  # type: ignore[index]
    code, listed = _run(gov_cli, "rules", "list")
    assert [r["rule_id"] for r in listed] == [rule_id]  # type: ignore[attr-defined]
    code, _ = _run(gov_cli, "rules", "add", "--max-bytes", "5", "--max-writes", "3")
    assert code != 0, "exactly one rule kind per rule"
    shard_service.decide("fleet-a", "agent-7", "r1", [pb.WriteCandidate(
        record_id="rec-1", content_hash="h1", content="hi")])
    code, decisions = _run(gov_cli, "decisions", "--agent", "agent-7")
    assert code == 0
    assert [d["rule_ids"] for d in decisions] == [["builtin:suspended"]]  # type: ignore[attr-defined]
    code, _ = _run(gov_cli, "rules", "rm", rule_id)
    assert code == 0
    code, error = _run(gov_cli, "rules", "rm", rule_id)
    assert code == 2 and error["error"]["code"] == "NOT_FOUND"  # type: ignore[index]
    code, report = _run(gov_cli, "chain", "verify")
    assert code == 0 and report["ok"]  # type: ignore[index]


def test_agent_token_cannot_use_governor_commands(
        gov_cli: CliRunner, make_token: TokenFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_TOKEN", make_token("agent-1", "fleet-a", ("agent",)))
    monkeypatch.setattr(cli_output, "_settings", None)
    code, error = _run(gov_cli, "suspend", "agent-2")
    assert code == 2 and error["error"]["code"] == "PERMISSION_DENIED"  # type: ignore[index]


def test_tampered_row_is_found_and_stops_service(
        gov_cli: CliRunner, governor: GovernanceClient, shard_service: GovernanceClient,
        gov_settings: GovernanceSettings, governance: EngramServer,
) -> None:
    governor.set_tier("mallory", "suspended")
    shard_service.decide("fleet-a", "mallory", "r1", [pb.WriteCandidate(
        record_id="rec-1", content_hash="h1", content="let me in")])
    engine = sqlalchemy.create_engine(normalize_url(gov_settings.database_url()))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(
            "UPDATE agents SET tier = 'trusted', score = 1000 WHERE agent_id = 'mallory'"))
    engine.dispose()
    code, report = _run(gov_cli, "chain", "verify")
    assert code == 1 and not report["ok"]  # type: ignore[index]
    assert any("mallory" in p for p in report["problems"])  # type: ignore[index]

    governance.stop(0)
    restarted = build_governance_server(gov_settings)
    restarted.start()
    try:
        # The start checks the links from the last verified checkpoint; the replay against
        # the state tables, which finds the edited row, runs next in the background.
        with grpc.insecure_channel(restarted.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 60
            while (stub.Check(health_pb2.HealthCheckRequest()).status
                   != health_pb2.HealthCheckResponse.NOT_SERVING
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            status = stub.Check(health_pb2.HealthCheckRequest())
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        service = GovernanceClient(restarted.address, shard_service.metadata[0][1][7:])
        with pytest.raises(EngramRpcError) as refused:
            service.decide("fleet-a", "mallory", "r2", [pb.WriteCandidate(
                record_id="rec-2", content_hash="h2", content="again")])
        assert refused.value.code == grpc.StatusCode.DATA_LOSS
        service.close()
    finally:
        restarted.stop(0)


def test_altered_chain_entry_is_found(governor: GovernanceClient,
                                      gov_settings: GovernanceSettings) -> None:
    governor.set_tier("a1", "probation", reason="first")
    governor.set_tier("a1", "standard", reason="second")
    engine = sqlalchemy.create_engine(normalize_url(gov_settings.database_url()))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(
            "UPDATE witness_chain SET payload_json = replace(payload_json, 'first', 'other') "
            "WHERE seq = 0"))
    engine.dispose()
    report = governor.verify_chain()
    assert not report.ok
    assert any("entry 0" in p for p in report.problems)
