"""A gate that sees the whole record, against real governance and shard servers on loopback.

Findings of issue 15 replayed: a deny rule sees metadata, tags and source (3);
compaction does not launder a suspended author's text (4); every record names
its gate decision and `engram verify --gate` reconciles them; cached trust
outlives a governance outage; dedup never answers one author with another's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner

import engram.cli._output as cli_output
from engram.cli.main import app
from engram.client import ShardClient
from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from services.shard.governance_gate import connect_governance
from services.shard.server import build_shard_server
from services.shard.service import ShardService
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory

DAY = 86400.0
FLEET = "fleet-w"


@dataclass
class Stack:
    governance: EngramServer
    shard: EngramServer
    service: ShardService
    tokens: TokenFactory
    opened: list[ShardClient | GovernanceClient]

    def agent(self, name: str) -> ShardClient:
        client = ShardClient(self.shard.address, self.tokens(name, FLEET, ("agent",)))
        self.opened.append(client)
        return client

    def governor(self) -> GovernanceClient:
        client = GovernanceClient(self.governance.address,
                                  self.tokens("ops", FLEET, ("governor",)))
        self.opened.append(client)
        return client

    def compactor(self) -> ShardClient:
        client = ShardClient(self.shard.address,
                             self.tokens("svc-compactor", "system", ("service",)))
        self.opened.append(client)
        return client


@pytest.fixture(params=["sqlite", "postgres"])
def shard_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shard.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def stack(tmp_path: Path, engram_home: Path, make_token: TokenFactory,
          shard_url: str) -> Iterator[Stack]:
    governance = build_governance_server(GovernanceSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'governance.db'}"))
    governance.start()
    token_file = tmp_path / "shard-service.token"
    write_token_file(token_file, make_token("svc-shard", "system", ("service",)))
    # TTL 0: every read asks governance again, so an outage is always "past the TTL". A
    # trust lookup slower than its timeout falls back to the last known multiplier (by
    # design): 5 s, not the 0.5 s default, so a loaded CI host does not look like an outage
    # (a suspension then went unseen once in a full run, 2026-11-24).
    gate, trust = connect_governance(governance.address, token_file, gate_timeout=2.0,
                                     trust_timeout=5.0, ttl_seconds=0.0)
    shard, service = build_shard_server(
        ShardSettings(home=engram_home, port=0, db_url=shard_url, embedder="none"),
        gate=gate, trust=trust)
    shard.start()
    built = Stack(governance, shard, service, make_token, [])
    try:
        yield built
    finally:
        for client in built.opened:
            client.close()
        shard.stop(0)
        governance.stop(0)


def _refused(call: object) -> EngramRpcError:
    assert callable(call)
    with pytest.raises(EngramRpcError) as error:
        call()
    return error.value


SECRET = "db password=hunter2"


def test_finding_3_a_deny_rule_sees_content_metadata_tags_and_source(stack: Stack) -> None:
    governor = stack.governor()
    rule = governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="password[:=]"))).rule
    writer, reader = stack.agent("leaky"), stack.agent("reader")
    attempts = {
        "content": lambda: writer.add(SECRET),
        "metadata value": lambda: writer.add("connection notes", metadata={"note": SECRET}),
        "metadata key": lambda: writer.add("connection notes", metadata={SECRET: "x"}),
        "tag": lambda: writer.add("connection notes", tags=[SECRET]),
        "source": lambda: writer.add("connection notes", source="password=hunter2"),
    }
    for where, attempt in attempts.items():
        refused = _refused(attempt)
        assert refused.code == grpc.StatusCode.PERMISSION_DENIED, where
        assert refused.metadata["rule_ids"] == rule.rule_id, where
        assert "deny pattern" in refused.message, where
    assert list(writer.list()) == []
    assert reader.search("hunter2") == [] and reader.search("connection notes") == []
    denied = [d for d in governor.decisions(agent_id="leaky")]
    assert len(denied) == len(attempts) and not any(d.allowed for d in denied)


def test_a_size_limit_counts_metadata_and_tags(stack: Stack) -> None:
    governor = stack.governor()
    rule = governor.add_rule(pb.Rule(size_limit=pb.SizeLimit(max_bytes=200))).rule
    writer = stack.agent("bulky")
    writer.add("a short note", metadata={"k": "v"})
    refused = _refused(lambda: writer.add("another note", metadata={"blob": "x" * 300}))
    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert refused.metadata["rule_ids"] == rule.rule_id
    refused = _refused(lambda: writer.add("short", tags=[f"t{i:02d}-{'y' * 20}" for i in
                                                           range(10)]))
    assert refused.metadata["rule_ids"] == rule.rule_id


@pytest.mark.parametrize(("pattern", "construct"), [
    (r"(\w+) \1", "backreference"), ("secret(?=:)", "lookahead"),
    ("(?<!no )secret", "negative lookbehind"), ("(?>a+)b", "atomic group"),
])
def test_create_rule_refuses_what_re2_cannot_match_naming_it(
        stack: Stack, pattern: str, construct: str) -> None:
    refused = _refused(lambda: stack.governor().add_rule(
        pb.Rule(deny_pattern=pb.DenyPattern(pattern=pattern))))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.reason == "UNSAFE_PATTERN"
    assert construct in refused.message


def _write_long_ago(stack: Stack, writes: list[tuple[ShardClient, str]]) -> None:
    real_clock = stack.service.clock
    stack.service.clock = lambda: real_clock() - 120 * DAY
    try:
        for client, text in writes:
            client.add(text, importance=0.1, run_id="r1", domain="technical")
    finally:
        stack.service.clock = real_clock


def test_finding_4_compaction_does_not_launder_a_suspended_authors_text(stack: Stack) -> None:
    honest, mallory, reader = stack.agent("honest"), stack.agent("mallory"), stack.agent("rd")
    _write_long_ago(stack, [(honest, "The deploy pipeline caches wheels per branch"),
                            (mallory, "The deploy pipeline skips the integrity checks"),
                            (honest, "The deploy pipeline pins the base image digest")])
    stack.governor().set_tier("mallory", "suspended", reason="poisoning")
    report = stack.compactor().compact(FLEET)
    assert len(report.groups) == 1
    summary = report.groups[0].summary
    assert "integrity checks" not in summary.content
    texts = [h.record.content for h in reader.search("deploy pipeline integrity checks")]
    assert texts and not any("integrity checks" in t for t in texts)
    assert report.compacted == 2
    assert summary.agent_id == "compactor" and summary.gate_decision_id
    assert json.loads(summary.metadata["source_authors"]) == ["honest"]
    assert any(h.record.id == summary.id for h in reader.search("deploy pipeline"))


def test_a_summary_ranks_with_the_lowest_trust_of_its_sources(stack: Stack) -> None:
    first, second, reader = stack.agent("w1"), stack.agent("w2"), stack.agent("rd")
    _write_long_ago(stack, [(first, "Invoices are archived after ninety days"),
                            (second, "Invoices are exported to the ledger nightly")])
    summary = stack.compactor().compact(FLEET).groups[0].summary
    assert json.loads(summary.metadata["source_authors"]) == ["w1", "w2"]
    assert [h.record.id for h in reader.search("invoices ledger archived")] == [summary.id]
    stack.governor().set_tier("w2", "suspended", reason="found out later")
    assert reader.search("invoices ledger archived") == []


def test_cached_trust_outlives_a_governance_outage(stack: Stack) -> None:
    mallory, quiet, reader = stack.agent("mallory"), stack.agent("quiet"), stack.agent("rd")
    mallory.add("The backup bucket is world readable by design", domain="technical")
    quiet.add("Rotate the backup bucket keys every quarter", domain="technical")
    stack.governor().set_tier("mallory", "suspended", reason="poisoning")
    seen = [h.record.agent_id for h in reader.search("backup bucket world readable design")]
    assert "mallory" not in seen and "quiet" in seen  # both authors' trust is now cached
    stack.governance.stop(0)
    # Past the TTL and governance down: the cached 0.0 still holds; nobody flips to 1.0.
    down = [h.record.agent_id for h in reader.search("backup bucket world readable design")]
    assert "mallory" not in down and "quiet" in down


def test_an_author_never_seen_fails_open_while_governance_is_down(stack: Stack) -> None:
    stranger, reader = stack.agent("stranger"), stack.agent("rd")
    stranger.add("Lunch is served at noon on Fridays")
    stack.governance.stop(0)
    assert [h.record.agent_id for h in reader.search("lunch fridays")] == ["stranger"]


def test_dedup_never_answers_one_author_with_anothers_record(stack: Stack) -> None:
    alice, bob = stack.agent("alice"), stack.agent("bob")
    first = alice.add("The staging database restarts every Sunday", run_id="r1")
    again = alice.add("the staging database  restarts every sunday", run_id="r1")
    assert again.duplicate_of == first.record.id  # one author's duplicate is still caught
    mine = bob.add("The staging database restarts every Sunday", run_id="r1")
    assert mine.created and not mine.duplicate_of
    assert mine.record.agent_id == "bob" and mine.record.id != first.record.id
    stack.governor().set_tier("alice", "suspended", reason="poisoning")
    hits = bob.search("staging database restarts")
    assert [h.record.id for h in hits] == [mine.record.id]  # alice's suspension hides only hers


def test_every_record_names_its_gate_decision_and_verify_gate_reconciles(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = stack.agent("scribe")
    stored = writer.add("The on-call rota lives in the ops wiki").record
    decision = next(d for d in stack.governor().decisions(agent_id="scribe"))
    assert stored.gate_decision_id == decision.decision_id and decision.allowed
    assert stack.governor().decisions_by_id([stored.gate_decision_id, "dec_unknown"]) == [
        decision]
    monkeypatch.setenv("ENGRAM_SHARD_ADDR", stack.shard.address)
    monkeypatch.setenv("ENGRAM_GOVERNANCE_ADDR", stack.governance.address)
    monkeypatch.setenv("ENGRAM_TOKEN", stack.tokens("ops", FLEET, ("governor",)))
    monkeypatch.setattr(cli_output, "_settings", None)
    result = CliRunner().invoke(app, ["verify", "--gate", "--json"])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout) == {"checked": 1, "ok": True, "problems": []}


def test_verify_gate_names_records_stored_without_an_allowing_decision(
        engram_home: Path, make_token: TokenFactory, stack: Stack, shard_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An ungated shard on the same store (ENGRAM_SHARD_ALLOW_UNGATED) records no decision.
    ungated, _ = build_shard_server(ShardSettings(
        home=engram_home, port=0, db_url=shard_url, embedder="none", allow_ungated=True,
        migrate=False))
    ungated.start()
    try:
        sneaky = ShardClient(ungated.address, make_token("sneaky", FLEET, ("agent",)))
        stored = sneaky.add("Written around the gate").record
        sneaky.close()
    finally:
        ungated.stop(0)
    assert stored.gate_decision_id == ""
    stack.agent("scribe").add("Written through the gate")
    monkeypatch.setenv("ENGRAM_SHARD_ADDR", stack.shard.address)
    monkeypatch.setenv("ENGRAM_GOVERNANCE_ADDR", stack.governance.address)
    monkeypatch.setenv("ENGRAM_TOKEN", make_token("ops", FLEET, ("governor",)))
    monkeypatch.setattr(cli_output, "_settings", None)
    result = CliRunner().invoke(app, ["verify", "--gate", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["checked"] == 2 and not report["ok"]
    assert [p["id"] for p in report["problems"]] == [stored.id]
    assert "ungated" in report["problems"][0]["detail"]


def test_batch_get_decisions_is_for_governors_only(stack: Stack) -> None:
    for roles in (("agent",), ("service",)):
        client = GovernanceClient(stack.governance.address,
                                  stack.tokens("someone", FLEET, roles))
        stack.opened.append(client)
        refused = _refused(lambda c=client: c.decisions_by_id(["dec_x"]))
        assert refused.code == grpc.StatusCode.PERMISSION_DENIED


def test_a_retry_with_another_body_is_judged_again_not_replayed(stack: Stack) -> None:
    stack.governor().add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="password[:=]")))
    writer, reader = stack.agent("retrier"), stack.agent("rd")
    submit = stack.service._committer.submit
    crashed: list[bool] = []

    def crash_once(job: object) -> object:  # the shard dies after the gate allowed the write
        if not crashed:
            crashed.append(True)
            raise ConnectionError("database went away")
        return submit(job)  # type: ignore[arg-type]

    stack.service._committer.submit = crash_once  # type: ignore[method-assign]
    with pytest.raises(EngramRpcError):
        writer.add("connection notes", request_id="req-1", metadata={"note": "none"})
    # Same request_id and content, a secret in the metadata: the earlier "allowed" must not
    # be replayed for a body the gate never saw.
    refused = _refused(lambda: writer.add("connection notes", request_id="req-1",
                                          metadata={"note": SECRET}))
    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert reader.search("connection notes") == []
    retried = writer.add("connection notes", request_id="req-1", metadata={"note": "none"})
    assert retried.created and retried.record.metadata["note"] == "none"
