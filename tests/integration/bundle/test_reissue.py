"""``engram import-bundle --reissue-ids`` (docs/bundle.md, docs/erasure.md): records written
before format 2, whose ids derive from their text, land under new ids with salted
commitments, everything naming them follows, the target verifies, and none of the derived ids
(nor an erased record's plain SHA-256) is left in any file of the target."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.client import EngramRpcError, ShardClient
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from services.artifacts.domain import chain
from services.artifacts.domain.chain import manifest_id, sha256_text
from services.compactor.domain.warm_chain import IterationInput, WarmLine, genesis_hash
from services.compactor.servicer import summary_pb
from services.governance.domain.decisions import decision_id
from services.shard.domain import records
from services.shard.servicer import record_to_proto
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.stack import FullStack, full_stack

FLEET = "fleet-a"
AGENT = "scout-1"


def legacy(content: str, created_us: int, refs: tuple[str, ...] = ()) -> records.Record:
    """A format-1 record as one written before salted commitments: its id derived from its
    text, and the gate decision that admitted it named in it."""
    sha = records.content_hash(content)
    return records.seal(records.Record(
        id=records.record_id(FLEET, "run-1", AGENT, sha), fleet_id=FLEET, run_id="run-1",
        agent_id=AGENT, content=content, content_hash=sha, record_hash="", domain="insights",
        source="manual", importance=0.5, tags=(), metadata={}, cross_refs=refs,
        created_us=created_us,
        gate_decision_id=decision_id(FLEET, AGENT, f"old-{created_us}", 0)))


def plant_legacy(stack: FullStack, admin: str) -> tuple[records.Record, ...]:
    """Three format-1 records (the second names the first) and their decisions, as a bundle
    of that time brought them."""
    alpha = legacy("zqx legacy lesson alpha", 1_700_000_000_000_000)
    beta = legacy(f"zqx legacy lesson beta, see shard:{alpha.id}", 1_700_000_001_000_000,
                  (f"record:{alpha.id}",))
    secret = legacy("zqx the vendor's private number 0471", 1_700_000_002_000_000)
    planted = (alpha, beta, secret)
    with GovernanceClient(stack.governance.address, admin) as gov:
        gov.import_decisions([gpb.GateDecision(
            decision_id=r.gate_decision_id, allowed=True, fleet_id=FLEET, agent_id=AGENT,
            request_id=f"old-{r.created_us}", record_id=r.id, content_hash=r.content_hash,
            position=0, create_time=Timestamp(seconds=r.created_us // 1_000_000)) for r in planted])
    with ShardClient(stack.shard.address, admin) as shard:
        assert shard.import_records([record_to_proto(r) for r in planted]).created == 3
    return planted


def files_holding(root: Path, needles: list[bytes]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits = [n.decode() for n in needles if n in data]
            if hits:
                found[str(path.relative_to(root))] = hits
    return found


def test_records_written_before_format_2_are_re_addressed_on_import(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", FLEET, ADMIN)
    bundle, key, id_map = tmp_path / "f.bundle", tmp_path / "reissue.key", tmp_path / "ids.jsonl"
    with full_stack(tmp_path / "a", engram_home, make_token) as origin:
        alpha, beta, secret = plant_legacy(origin, admin)
        with ShardClient(origin.shard.address, make_token(AGENT, FLEET)) as shard:
            shard.add(f"zqx a note written now, see shard:{alpha.id}", run_id="run-1")
        with cli_for(origin, admin, monkeypatch) as run:
            run("forget", "--record", secret.id, "--reason", "asked to")
            assert run("export", "--fleet", FLEET, "-o", str(bundle))["rows"]["tombstones"] == 1
    old_ids = [alpha.id, beta.id, secret.id]
    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        with cli_for(target, admin, monkeypatch) as run:
            refused = run("import-bundle", str(bundle), "--reissue-ids", str(key), code=1)
            assert "--new-reissue-key" in refused["error"]["message"]  # never made unasked
            first = run("import-bundle", str(bundle), "--reissue-ids", str(key),
                        "--new-reissue-key", "--id-map", str(id_map))
            assert first["reissued"] == 3
            assert (first["created"]["records"], first["created"]["tombstones"]) == (3, 1)
            renamed = {row["old"]: row["new"] for row in map(json.loads,
                                                             id_map.read_text().splitlines())}
            assert sorted(renamed) == sorted(old_ids)
            assert stat.S_IMODE(id_map.stat().st_mode) == stat.S_IMODE(key.stat().st_mode) == 0o600
            assert run("verify", "--all")["ok"]  # every record re-hashes, the tombstone listed
            assert run("verify", "--gate")["ok"]  # every record reconciles with its decision
            again = run("import-bundle", str(bundle), "--reissue-ids", str(key))
            assert not any(again["created"].get(kind) for kind in (
                "records", "tombstones", "decisions", "erasures")), again
        with ShardClient(target.shard.address, admin) as shard:
            stored = {r.content.split(",")[0]: r for r in shard.list(run_id="run-1")}
            assert {r.id for r in stored.values()}.isdisjoint(old_ids)
            assert {r.format for r in stored.values()} == {2}
            new_alpha = renamed[alpha.id]
            assert stored["zqx legacy lesson alpha"].id == new_alpha
            for text in ("zqx legacy lesson beta", "zqx a note written now"):
                assert list(stored[text].cross_refs) == [f"record:{new_alpha}"]
                assert stored[text].content.endswith(f"see shard:{new_alpha}")
            for old in old_ids:
                with pytest.raises(EngramRpcError) as missing:
                    shard.get(old)
                assert missing.value.code.name == "NOT_FOUND"
            (tombstone,) = list(shard.tombstones())
            assert (tombstone.id, tombstone.format) == (renamed[secret.id], 2)
            hits = shard.search("legacy lesson alpha", mode="lexical", limit=3)
            assert new_alpha in {hit.record.id for hit in hits}
        with GovernanceClient(target.governance.address, admin) as gov:
            (erasure,) = list(gov.erasures())
            assert [(i.id, i.leaf_hash) for i in erasure.items] == [
                (tombstone.id, tombstone.record_hash)]
            assert erasure.selector_value == tombstone.id
        # Nothing the derived ids or the erased text's plain hash could be checked against.
        needles = [i.encode() for i in old_ids] + [secret.content_hash.encode()]
        assert files_holding(tmp_path / "b", needles) == {}


def test_a_run_bundle_is_refused_with_nothing_imported(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's bundle holds erasures and references naming other runs' records, which it cannot
    rename (found in review: their derived ids were left, and a second run's bundle then
    conflicted on the shared erasure)."""
    admin = make_token("op", FLEET, ADMIN)
    bundle, key = tmp_path / "r.bundle", tmp_path / "k"
    with full_stack(tmp_path / "a", engram_home, make_token) as origin:
        plant_legacy(origin, admin)
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "--run", "run-1", "-o", str(bundle))
    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        with cli_for(target, admin, monkeypatch) as run:
            refused = run("import-bundle", str(bundle), "--reissue-ids", str(key),
                          "--new-reissue-key", code=1)
            assert "needs a bundle of the whole fleet" in refused["error"]["message"]
        with ShardClient(target.shard.address, admin) as shard:
            assert list(shard.list()) == []
        with GovernanceClient(target.governance.address, admin) as gov:
            assert list(gov.decisions(fleet_id=FLEET)) == []


def test_id_map_needs_reissue_ids_and_a_key_file_must_hold_a_key(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", FLEET, ADMIN)
    bundle, bad_key = tmp_path / "f.bundle", tmp_path / "bad.key"
    bad_key.write_text("not a key\n")
    bad_key.chmod(0o600)
    with full_stack(tmp_path / "a", engram_home, make_token) as origin:
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "-o", str(bundle))
            run("import-bundle", str(bundle), "--id-map", str(tmp_path / "m"), code=2)
            run("import-bundle", str(bundle), "--new-reissue-key", code=2)
            refused = run("import-bundle", str(bundle), "--reissue-ids", str(bad_key), code=1)
            assert "does not hold a reissue key" in refused["error"]["message"]
        assert not (tmp_path / "m").exists()


def plant_legacy_run(stack: FullStack, admin: str) -> dict[str, str]:
    """A run whose manifest, first two events and snapshot were stored before salted
    commitments (format 1), then a format-2 event on top, as the upgrade found it; the
    derived and plain hashes a guess could be checked against, by name."""
    manifest = '{"window":["zqx old window"]}'
    payloads = ['{"said":"zqx old payload one"}', '{"said":"zqx old payload two"}']
    state = '{"zqx":"old state"}'
    created = Timestamp(seconds=1_700_000_000)
    with ArtifactsClient(stack.artifacts.address, admin) as art:
        art.start_run("run-old")
        old_manifest = apb.Manifest(
            manifest_id=manifest_id(manifest), run_id="run-old", content_json=manifest,
            content_hash=sha256_text(manifest), create_time=created)
        events, prev = [], chain.GENESIS
        for seq, payload in enumerate(payloads, 1):
            link = chain.event_hash(
                prev_hash=prev, run_id="run-old", seq=seq, type="tool.called",
                payload_json=payload, manifest_id=old_manifest.manifest_id, artifact_ids=(),
                agent_id="op", created_us=created.ToMicroseconds())
            events.append(apb.Event(run_id="run-old", seq=seq, type="tool.called",
                                    payload_json=payload, manifest_id=old_manifest.manifest_id,
                                    create_time=created, prev_hash=prev, hash=link,
                                    agent_id="op", format=1))
            prev = link
        snapshot = apb.Snapshot(snapshot_id="snap_" + "5" * 32, run_id="run-old", seq=2,
                                state_json=state, state_hash=sha256_text(state),
                                manifest_id=old_manifest.manifest_id, create_time=created,
                                format=1)
        art.import_run_items(manifests=[old_manifest], events=events, snapshots=[snapshot])
        art.append_event("run-old", "note", {"said": "zqx written since"})
    return {"manifest id": old_manifest.manifest_id, "manifest sha": sha256_text(manifest),
            "event 1": events[0].hash, "event 2": events[1].hash,
            "payload sha": sha256_text(payloads[0]), "state sha": sha256_text(state)}


def test_a_run_s_format_1_items_are_re_addressed_and_its_chain_derived_again(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", FLEET, ADMIN)
    bundle, key, id_map = tmp_path / "f.bundle", tmp_path / "k", tmp_path / "ids.jsonl"
    with full_stack(tmp_path / "a", engram_home, make_token, governed=True) as origin:
        old = plant_legacy_run(origin, admin)
        with cli_for(origin, admin, monkeypatch) as run:
            # the format-2 event on top is erased in place: its tombstone must follow the chain
            assert run("forget", "--match", "zqx written since")["events_erased"] == 1
            run("export", "--fleet", FLEET, "-o", str(bundle))
    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token, governed=True) as target:
        with cli_for(target, admin, monkeypatch) as run:
            first = run("import-bundle", str(bundle), "--reissue-ids", str(key),
                        "--new-reissue-key", "--id-map", str(id_map))
            assert first["created"]["events"] == 3 and first["reissued"] == 1
            verified = run("artifacts", "verify")
            assert not [v for k, v in verified.items() if k.endswith("roblems") and v], verified
            assert run("events", "verify", "run-old")["tombstoned"] == 1  # the chain holds
            again = run("import-bundle", str(bundle), "--reissue-ids", str(key))
            assert not any(again["created"].get(k) for k in ("manifests", "events", "snapshots"))
        renamed = {row["old"]: row["new"]
                   for row in map(json.loads, id_map.read_text().splitlines())}
        with ArtifactsClient(target.artifacts.address, admin) as art:
            events = list(art.list_events("run-old"))
            assert [e.format for e in events] == [2, 2, 2]
            assert {e.manifest_id for e in events[:2]} == {renamed[old["manifest id"]]}
            assert events[2].erasure_id and not events[2].payload_json  # still a tombstone
            manifest = art.get_manifest(renamed[old["manifest id"]])
            assert manifest.format == 2 and manifest.content_hash != old["manifest sha"]
        needles = [value.encode() for value in old.values()]
        assert files_holding(tmp_path / "b", needles) == {}


def plant_legacy_log(stack: FullStack, admin: str, agent: str) -> dict[str, str]:
    """An iteration log whose first two lines were recorded before salted commitments (format
    1; the first with its detail, the second's detail gone), then a format-2 line on top."""
    prev, items, old = genesis_hash(FLEET, "log-old"), [], {}
    for n, detail in ((1, '{"zqx":"old detail one"}'), (2, '{"zqx":"old detail two"}')):
        item = IterationInput(
            iteration=n, plan_digest=f"p{n}", parent_digest="", start_ts="", end_ts="",
            files_touched=1, net_add=2, net_del=0, risk_score=0.1, status="ok",
            detail_json=detail, guardrails_json="[]")
        line = WarmLine.chained(item, n, prev)  # no salt: format 1
        items.append(cpb.ImportedIteration(
            summary=summary_pb(line), detail_json=detail if n == 1 else "",
            guardrails_json="[]" if n == 1 else ""))
        old[f"line {n}"], old[f"detail {n} sha"] = line.hash, line.detail_digest
        prev = line.hash
    with ArtifactsClient(stack.artifacts.address, admin) as art:
        art.start_run("log-old")  # a bundle carries the iteration logs of the fleet's runs
    with CompactorClient(stack.compactor.address, admin) as comp:
        assert comp.import_iterations("log-old", items).created == 2
    with CompactorClient(stack.compactor.address, agent) as comp:
        comp.record("log-old", iteration_from_json({"planDigest": "p3", "status": "ok",
                                                    "detail": {"n": 3}}))
    return old


def test_an_iteration_log_s_format_1_lines_are_re_addressed_and_its_chain_derived_again(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", FLEET, ADMIN)
    bundle, key = tmp_path / "f.bundle", tmp_path / "k"
    with full_stack(tmp_path / "a", engram_home, make_token) as origin:
        old = plant_legacy_log(origin, admin, make_token(AGENT, FLEET))
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "-o", str(bundle))
    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        with cli_for(target, admin, monkeypatch) as run:
            first = run("import-bundle", str(bundle), "--reissue-ids", str(key),
                        "--new-reissue-key")
            assert first["created"]["iterations"] == 3
            again = run("import-bundle", str(bundle), "--reissue-ids", str(key))
            assert not again["created"].get("iterations")
        with CompactorClient(target.compactor.address, admin) as comp:
            verified = comp.verify("log-old")
            assert verified.ok and verified.lines_checked == 3, verified
            lines = [comp.reconstruct("log-old", n) for n in (1, 2, 3)]
            assert [r.summary.format for r in lines] == [2, 2, 2]
            assert lines[0].detail_json == '{"zqx":"old detail one"}'  # still checks out
        assert files_holding(tmp_path / "b", [v.encode() for v in old.values()]) == {}


@pytest.mark.parametrize("roles", [("governor",), ("agent",)])
def test_a_token_without_the_admin_role_imports_nothing(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch, roles: tuple[str, ...]) -> None:
    """--reissue-ids drives the admin-only import RPCs: without the admin role the first one
    is refused, the command exits 2 (a refused call) naming PERMISSION_DENIED, and the target
    holds nothing."""
    admin = make_token("op", FLEET, ADMIN)
    bundle, key = tmp_path / "f.bundle", tmp_path / "reissue.key"
    with full_stack(tmp_path / "a", engram_home, make_token) as origin:
        plant_legacy(origin, admin)
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", FLEET, "-o", str(bundle))
    (tmp_path / "b").mkdir()
    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        with cli_for(target, make_token("op", FLEET, roles), monkeypatch) as run:
            refused = run("import-bundle", str(bundle), "--reissue-ids", str(key),
                          "--new-reissue-key", "--id-map", str(tmp_path / "ids"), code=2)
            assert refused["error"]["code"] == "PERMISSION_DENIED", refused
            assert refused["error"]["metadata"] == {"required_roles": "admin"}
        with ShardClient(target.shard.address, admin) as shard:
            assert list(shard.list()) == []
        with GovernanceClient(target.governance.address, admin) as gov:
            assert list(gov.decisions(fleet_id=FLEET)) == []
            assert list(gov.erasures()) == []
        assert not (tmp_path / "ids").exists()
        # The key made for the refused run stays (a rerun names it without
        # --new-reissue-key) and is readable by its owner only.
        if key.exists():
            assert stat.S_IMODE(key.stat().st_mode) == 0o600
