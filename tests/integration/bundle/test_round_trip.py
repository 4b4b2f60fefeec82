"""export -> import-bundle -> export, SQLite to Postgres and back, through the CLI and real
servers: the same records and domains byte for byte, every run's snapshot verifying, the same
search results; a second import changes nothing; an altered bundle is refused, nothing written."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from engram.bundle import BundleReader, importer
from engram.bundle.export import Clients
from engram.bundle.importer import Importer
from engram.client import ShardClient
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for, populated_origin
from tests.integration.bundle.test_tombstones import erase_one
from tests.stack import FullStack, full_stack

# Every part but rules and trust, which differ by design (docs/bundle.md, "Import"): on the
# target a rule is the importer's act in governance's own chain (a new id and time), and trust
# scores follow the target's outcomes (only pinned tiers are set again).
CARRIED = ("parts/domains.jsonl", "parts/records.jsonl", "parts/runs.jsonl",
           "parts/artifacts.jsonl", "parts/events.jsonl", "parts/snapshots.jsonl",
           "parts/evidence.jsonl", "parts/manifests.jsonl", "parts/iterations.jsonl",
           "parts/decisions.jsonl", "parts/erasures.jsonl", "parts/tombstones.jsonl")
ERASED = {"erasures": 1, "tombstones": 1}
RUN_ITEMS = {"runs": 1, "artifacts": 1, "manifests": 1, "evidence": 1, "events": 3,
             "snapshots": 2, "iterations": 2}


def members(bundle: Path) -> dict[str, str]:
    with BundleReader(bundle) as reader:
        return {m.path: m.sha256 for m in reader.verify().members}


def observed(stack: FullStack, token: str) -> tuple[object, ...]:
    """What a reader sees: each run's verified snapshot and the hits of a few searches (as
    sets: SQLite's FTS5 and Postgres's full-text rank with different formulas), and run-1 as
    the artifacts service serves it: rehydrated, replayed (re-hashed), its artifact's bytes
    and a clean verify."""
    with ShardClient(stack.shard.address, token) as shard:
        snapshots = [[r.record_hash for r in shard.snapshot(run)]
                     for run in ("", "run-1", "run-2")]
        searches = [sorted(h.record.id for h in shard.search(q, mode="lexical", limit=20))
                    for q in ("idempotency keys", "gateway protocol", "lesson 7")]
    with ArtifactsClient(stack.artifacts.address, token) as art:
        view = art.rehydrate("run-1")
        artifact = next(iter(art.list_artifacts("run-1")))
        _, chunks = art.read(artifact.artifact_id)
        verified = art.verify("run-1")
        assert not verified.problems and not verified.snapshot_problems
        run = (view.run.SerializeToString(deterministic=True),
               view.snapshot.SerializeToString(deterministic=True),
               [e.hash for e in view.events], [e.hash for e in art.replay("run-1")],
               b"".join(chunks), verified.checked, verified.snapshots_checked)
    with CompactorClient(stack.compactor.address, token) as comp:
        report = comp.verify("run-1")
        assert report.ok, report
        iterations = (report.head_hash, comp.reconstruct("run-1", 1).SerializeToString(
            deterministic=True), [h.detail_json for h in comp.recent("run-1")])
    return snapshots, searches, run, iterations


def test_round_trip_sqlite_postgres_sqlite(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        fresh_postgres_urls: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", "fleet-a", ADMIN)
    first, second, third = (tmp_path / f"{n}.bundle" for n in ("first", "second", "third"))
    with populated_origin(tmp_path, engram_home, make_token, dirs="abc") as origin:
        with ShardClient(origin.shard.address, admin) as shard:  # summaries replace originals
            compacted = shard.compact(importance_below=0.35, older_than_days=0)
            assert compacted.compacted >= 2
            stored = 14 + len(compacted.groups)
        erase_one(origin, admin, monkeypatch)  # its erasure and tombstone travel too
        seen = observed(origin, admin)
        with cli_for(origin, admin, monkeypatch) as run:
            digest = run("export", "--fleet", "fleet-a", "-o", str(first))["content_digest"]
    on_postgres = {name: fresh_postgres_urls()  # every service's store
                   for name in ("shard", "governance", "artifacts", "compactor")}
    with full_stack(tmp_path / "b", engram_home, make_token, on_postgres) as postgres:
        with cli_for(postgres, admin, monkeypatch) as run:
            loaded = run("import-bundle", str(first), "--expect", digest)
            assert loaded["created"] == {"rules": 1, "trust": 1, "decisions": stored,
                                         "domains": 0, "records": stored - 1, **ERASED,
                                         **RUN_ITEMS}
            assert loaded["not_imported"] == {}
            assert run("verify", "--gate")["ok"]  # every record reconciles with its decision
            again = run("import-bundle", str(first))
            assert set(again["created"].values()) == {0}
            assert again["already_present"] == {"rules": 1, "trust": 1, "decisions": stored,
                                                "domains": 5, "records": stored - 1, **ERASED,
                                                **RUN_ITEMS}
            assert run("gov", "chain", "verify")["ok"]
            assert [r["description"] for r in run("gov", "rules", "list")] == ["no secrets"]
            run("export", "--fleet", "fleet-a", "-o", str(second))
        assert observed(postgres, admin) == seen
        with GovernanceClient(postgres.governance.address, admin) as gov:
            rogue = gov.trust("rogue")
            assert (rogue.tier, rogue.pinned) == (gpb.TRUST_TIER_SUSPENDED, True)
    with full_stack(tmp_path / "c", engram_home, make_token) as back:
        with cli_for(back, admin, monkeypatch) as run:
            run("import-bundle", str(second))
            assert run("verify", "--gate")["ok"]
            run("export", "--fleet", "fleet-a", "-o", str(third))
        assert observed(back, admin) == seen
    one, two, three = members(first), members(second), members(third)
    for path in CARRIED:
        assert one[path] == two[path] == three[path], path
    blobs = {path for path in one if path.startswith("blobs/")}
    assert len(blobs) == 1
    assert {p: one[p] for p in blobs} == {p: three[p] for p in blobs}


def test_an_altered_bundle_is_refused_naming_it_and_nothing_is_written(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", "fleet-a", ADMIN)
    bundle, altered = tmp_path / "x.bundle", tmp_path / "altered.bundle"
    with populated_origin(tmp_path, engram_home, make_token) as origin, \
            cli_for(origin, admin, monkeypatch) as run:
        run("export", "--fleet", "fleet-a", "-o", str(bundle))
    with tarfile.open(bundle) as old, tarfile.open(altered, "w") as new:
        for info in old.getmembers():
            data = old.extractfile(info).read()  # type: ignore[union-attr]
            if info.name == "parts/records.jsonl":  # the last record's importance raised
                data = data[:data.rindex(b'"importance":')] + b'"importance":1.0,' + \
                    data[data.rindex(b'"metadata"'):] if b'"metadata"' in data else data + b" "
            info.size = len(data)
            new.addfile(info, io.BytesIO(data))
    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        with cli_for(target, admin, monkeypatch) as run:
            refused = run("import-bundle", str(altered), code=1)
            assert refused["error"]["problems"][0].startswith(
                "parts/records.jsonl was altered")
            run("import-bundle", str(bundle), "--expect", "0" * 64, code=1)
        with ShardClient(target.shard.address, admin) as shard:
            assert shard.status().total_records == 0


class Interrupted(Exception):
    pass


def test_an_interrupted_import_resumes_when_run_again(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", "fleet-a", ADMIN)
    bundle = tmp_path / "x.bundle"
    with populated_origin(tmp_path, engram_home, make_token, dirs="abc") as origin, \
            cli_for(origin, admin, monkeypatch) as run:
        run("export", "--fleet", "fleet-a", "-o", str(bundle))
    monkeypatch.setattr(importer, "BATCH", 5)

    def stop_after_first_batch(kind: str, rows: int, nbytes: int) -> None:
        if kind == "records":
            raise Interrupted

    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        where = target.addresses()
        clients = Clients(ShardClient(where["shard"], admin),
                          GovernanceClient(where["governance"], admin),
                          ArtifactsClient(where["artifacts"], admin),
                          CompactorClient(where["compactor"], admin))
        try:
            with BundleReader(bundle) as reader, pytest.raises(Interrupted):
                Importer(clients, stop_after_first_batch).run(reader)
            assert clients.shard.status().total_records == 5
            with BundleReader(bundle) as reader:
                report = Importer(clients).run(reader)
            assert (report.created["records"], report.already_present["records"]) == (9, 5)
            assert clients.shard.status().total_records == 14
        finally:
            clients.close()

    def stop_in_the_events(kind: str, rows: int, nbytes: int) -> None:
        if kind == "events":
            raise Interrupted

    # Cut again, inside a run's event chain (one event a call): the run is left at a prefix
    # of its chain, and the next import extends it from there.
    with full_stack(tmp_path / "c", engram_home, make_token) as target:
        where = target.addresses()
        clients = Clients(ShardClient(where["shard"], admin),
                          GovernanceClient(where["governance"], admin),
                          ArtifactsClient(where["artifacts"], admin),
                          CompactorClient(where["compactor"], admin))
        try:
            monkeypatch.setattr(importer, "BATCH", 1)
            with BundleReader(bundle) as reader, pytest.raises(Interrupted):
                Importer(clients, stop_in_the_events).run(reader)
            assert clients.artifacts.get_run("run-1").event_count == 1  # cut after one event
            with BundleReader(bundle) as reader:
                report = Importer(clients).run(reader)
            assert (report.created["events"], report.already_present["events"]) == (2, 1)
            assert report.already_present["artifacts"] == 1
            assert clients.artifacts.get_run("run-1").event_count == 3
            assert not clients.artifacts.verify("run-1").problems
            assert len(list(clients.artifacts.replay("run-1"))) == 3
        finally:
            clients.close()
