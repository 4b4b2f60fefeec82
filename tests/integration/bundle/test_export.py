"""`engram export` against real servers: every kind the fleet owns, nothing of another fleet,
the same bytes from the same state, and a run-only bundle."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from engram.bundle import BundleReader
from engram.client import ShardClient
from services.common.commitment import commitment
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, BLOB, cli_for, populate
from tests.stack import full_stack


def test_export_carries_every_kind_and_only_its_fleet(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with full_stack(tmp_path, engram_home, make_token) as stack:
        populate(stack, make_token)
        populate(stack, make_token, fleet="fleet-b")
        with cli_for(stack, make_token("op", "fleet-a", ADMIN), monkeypatch) as run:
            first = run("export", "--fleet", "fleet-a", "-o", str(tmp_path / "a.bundle"))
            again = run("export", "--fleet", "fleet-a", "-o", str(tmp_path / "b.bundle"))
            only = run("export", "--fleet", "fleet-a", "--run", "run-1",
                       "-o", str(tmp_path / "r.bundle"))
            run("export", "--fleet", "fleet-b", "-o", str(tmp_path / "x.bundle"), code=1)
            run("export", "--fleet", "fleet-a", "-o", str(tmp_path / "a.bundle"), code=2)
            into_itself = run("import-bundle", str(tmp_path / "a.bundle"))
            assert set(into_itself["created"].values()) == {0}
            assert len(run("gov", "rules", "list")) == 1
    assert first["rows"] == {"domains": 5, "records": 14, "rules": 1, "trust": 2,
                             "decisions": 14, "runs": 1, "artifacts": 1, "events": 3,
                             "snapshots": 2, "evidence": 1, "manifests": 1, "iterations": 2,
                             "erasures": 0, "tombstones": 0}
    assert again["content_digest"] == first["content_digest"]
    assert (tmp_path / "a.bundle").read_bytes() == (tmp_path / "b.bundle").read_bytes()
    assert not (tmp_path / "x.bundle").exists()
    assert only["rows"]["records"] == 6 and only["rows"]["decisions"] == 6
    assert only["rows"]["evidence"] == 0 and only["rows"]["artifacts"] == 1
    with BundleReader(tmp_path / "a.bundle") as reader:
        manifest = reader.verify()
        assert manifest.fleet_id == "fleet-a"
        records = list(reader.rows("records"))
        assert {r["fleet_id"] for r in records} == {"fleet-a"}
        assert all(r["record_hash"] and r["gate_decision_id"] for r in records)
        times = [(r["create_time"], r["id"]) for r in records]
        assert times == sorted(times)
        assert reader.blob(hashlib.sha256(BLOB).hexdigest()).read() == BLOB
        events = list(reader.rows("events"))
        assert [e["seq"] for e in events] == ["1", "2", "3"]
        # Format 2: salt and commitment travel with the payload, so the target re-checks both
        for event in events:
            assert event["format"] == 2
            assert event["payload_commitment"] == commitment(
                event["salt"], event["payload_json"].encode())
        snapshots = list(reader.rows("snapshots"))
        assert {s["format"] for s in snapshots} == {2}
        assert all(s["state_hash"] == commitment(s["salt"], s["state_json"].encode())
                   for s in snapshots)
        iterations = list(reader.rows("iterations"))
        assert [i["iteration"] for i in iterations] == ["1", "2"]
        for line in iterations:  # a warm line's salt and commitments travel with it too
            assert line["format"] == 2 and len(line["salt"]) == 64
            assert len(line["summary_commitment"]) == 64
            if line.get("detail_json"):
                assert line["detail_digest"] == commitment(line["salt"], (
                    f'{{"detail":{line["detail_json"]},'
                    f'"guardrails":{line["guardrails_json"]}}}').encode())


def test_a_domain_created_while_records_are_listed_comes_with_its_record(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An export read the domains, then the records: a domain created in between, with a
    record in it listed, gave a bundle whose import refused that record (UNKNOWN_DOMAIN)."""
    admin = make_token("op", "fleet-a", ADMIN)
    with full_stack(tmp_path, engram_home, make_token) as stack:
        populate(stack, make_token)
        listing = ShardClient.list

        def with_a_new_domain(self: ShardClient, *args: Any, **kwargs: Any) -> Any:
            with ShardClient(stack.shard.address, admin) as other:
                other.upsert_domain("finance", keywords=["invoice"])
                other.add("the invoice for the new domain", run_id="run-9", domain="finance")
            return listing(self, *args, **kwargs)

        monkeypatch.setattr(ShardClient, "list", with_a_new_domain)
        with cli_for(stack, admin, monkeypatch) as run:
            run("export", "--fleet", "fleet-a", "-o", str(tmp_path / "a.bundle"))
    with BundleReader(tmp_path / "a.bundle") as reader:
        reader.verify()
        domains = {d["name"] for d in reader.rows("domains")}
        assert {r.get("domain") for r in reader.rows("records")} <= domains
        assert "finance" in domains


def test_a_refused_export_says_why_as_json_and_writes_nothing(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With --json a bundle error is JSON on stdout, as import-bundle prints it (before, a
    plain line on stderr that a script parsing stdout could not read)."""
    out = tmp_path / "other.bundle"
    with (full_stack(tmp_path, engram_home, make_token) as stack,
          cli_for(stack, make_token("op", "fleet-a", ADMIN), monkeypatch) as run):
        refused = run("export", "--fleet", "fleet-b", "-o", str(out), code=1)
    assert "the token belongs to fleet 'fleet-a', not 'fleet-b'" in refused["error"]["message"]
    assert not out.exists() and not list(tmp_path.glob("other.bundle*"))
