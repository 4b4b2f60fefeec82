"""Erasures and erased records' tombstones in bundles (docs/bundle.md, docs/erasure.md): a
bundle made after an erasure carries it, and importing it erases the copy an older bundle
brought; afterwards the older bundle brings nothing back. ImportTombstones refuses a tombstone
that does not re-derive its hash, that no erasure here lists, of a record still stored, of
another fleet, or from a non-admin, storing nothing."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from google.protobuf.json_format import ParseDict

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.bundle import BundleReader
from engram.client import EngramRpcError, ShardClient
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient
from engram.client.governance import GovernanceClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb
from services.shard.domain import records
from services.shard.servicer import tombstone_from_proto, tombstone_to_proto
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for, populate, populated_origin
from tests.stack import FullStack, full_stack

ERASED = "architecture: the gateway protocol uses mTLS"


def erase_one(stack: FullStack, token: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``engram forget --record`` of the run-2 record; its id."""
    with ShardClient(stack.shard.address, token) as shard:
        record_id = next(r.id for r in shard.list(run_id="run-2"))
    with cli_for(stack, token, monkeypatch) as run:
        run("forget", "--record", record_id, "--reason", "asked to")
    return record_id


def test_an_erasure_travels_and_an_older_bundle_brings_nothing_back(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", "fleet-a", ADMIN)
    before, after = tmp_path / "before.bundle", tmp_path / "after.bundle"
    with populated_origin(tmp_path, engram_home, make_token) as origin:
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", "fleet-a", "-o", str(before))
        erased = erase_one(origin, admin, monkeypatch)
        with cli_for(origin, admin, monkeypatch) as run:
            exported = run("export", "--fleet", "fleet-a", "-o", str(after))
            assert (exported["rows"]["erasures"], exported["rows"]["tombstones"]) == (1, 1)
        with ShardClient(origin.shard.address, admin) as shard:
            kept = list(shard.tombstones())
    with full_stack(tmp_path / "b", engram_home, make_token) as target, \
            cli_for(target, admin, monkeypatch) as run:
            run("import-bundle", str(before))
            with ShardClient(target.shard.address, admin) as shard:
                assert shard.get(erased).content == ERASED  # the older copy is here
            loaded = run("import-bundle", str(after))
            assert (loaded["created"]["erasures"], loaded["already_present"]["tombstones"]) \
                == (1, 1)  # carrying the erasure out here left the tombstone
            assert loaded["not_imported"] == {}
            with ShardClient(target.shard.address, admin) as shard:
                with pytest.raises(EngramRpcError) as gone:
                    shard.get(erased)
                assert gone.value.reason == "RECORD_ERASED"
                assert not [h for h in shard.search("gateway protocol mTLS", mode="lexical")
                            if h.record.id == erased]
                here = {t.id: t for t in shard.tombstones()}
                assert here[erased].record_hash == kept[0].record_hash
                assert here[erased].erasure_id == kept[0].erasure_id
            verified = run("verify", "--all")
            assert verified["ok"] and verified["tombstoned"] == 1, verified
            assert run("gov", "chain", "verify")["ok"]
            refused = run("import-bundle", str(before), code=2)
            assert "RECORD_ERASED" in str(refused)
            with ShardClient(target.shard.address, admin) as shard, \
                    pytest.raises(EngramRpcError):
                shard.get(erased)
            again = run("import-bundle", str(after))
            assert (again["created"]["erasures"], again["created"]["tombstones"]) == (0, 0)


@pytest.fixture
def erased_stack(tmp_path: Path, engram_home: Path, make_token: TokenFactory,
                 monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[tuple[FullStack, spb.RecordTombstone]]:
    with full_stack(tmp_path, engram_home, make_token) as stack:
        populate(stack, make_token)
        admin = make_token("op", "fleet-a", ADMIN)
        erase_one(stack, admin, monkeypatch)
        with ShardClient(stack.shard.address, admin) as shard:
            yield stack, next(iter(shard.tombstones()))


def resealed(tombstone: spb.RecordTombstone, **changes: object) -> spb.RecordTombstone:
    """The tombstone with ``changes`` and a record_hash that re-derives from them."""
    entity = replace(tombstone_from_proto(tombstone), **changes)  # type: ignore[arg-type]
    digest = hashlib.sha256(records.structural_fields(entity, entity.body_commitment))
    return tombstone_to_proto(replace(entity, record_hash=digest.hexdigest()))


def test_the_same_tombstone_again_is_already_present(
        erased_stack: tuple[FullStack, spb.RecordTombstone], make_token: TokenFactory) -> None:
    stack, tombstone = erased_stack
    with ShardClient(stack.shard.address, make_token("op", "fleet-a", ("admin",))) as shard:
        reply = shard.import_tombstones([tombstone])
        assert (reply.created, reply.already_present) == (0, 1)


def test_bad_tombstones_are_refused_and_nothing_is_stored(
        erased_stack: tuple[FullStack, spb.RecordTombstone], make_token: TokenFactory) -> None:
    stack, tombstone = erased_stack
    admin = make_token("op", "fleet-a", ("admin", "governor"))
    with ShardClient(stack.shard.address, admin) as shard:
        live = next(r for r in shard.list(run_id="run-1"))
    with GovernanceClient(stack.governance.address, admin) as gov:  # recorded, not carried out
        pending = gov.record_erasure("record", live.id, [gpb.ErasedItem(
            kind="record", id=live.id, leaf_hash=live.record_hash)]).erasure.erasure_id
    altered = spb.RecordTombstone()
    altered.CopyFrom(tombstone)
    altered.importance = 0.99
    unlisted = resealed(tombstone, id="0" * 32)
    of_live = resealed(tombstone, id=live.id)
    of_live_listed = spb.RecordTombstone()
    of_live_listed.CopyFrom(tombstone)
    of_live_listed.id, of_live_listed.erasure_id = live.id, pending
    of_live_listed.record_hash, of_live_listed.format = live.record_hash, 1  # as listed
    of_live_listed.body_commitment = ""
    unknown = spb.RecordTombstone()
    unknown.CopyFrom(unlisted)
    unknown.erasure_id = "era_" + "0" * 28
    late = spb.RecordTombstone()
    late.CopyFrom(unlisted)
    late.erase_time.seconds = 400_000_000_000
    cases = [
        (altered, grpc.StatusCode.INVALID_ARGUMENT, "TOMBSTONE_HASH_MISMATCH"),
        (unlisted, grpc.StatusCode.FAILED_PRECONDITION, "TOMBSTONE_NOT_IN_ERASURE"),
        (of_live, grpc.StatusCode.FAILED_PRECONDITION, "TOMBSTONE_NOT_IN_ERASURE"),
        (of_live_listed, grpc.StatusCode.FAILED_PRECONDITION, "RECORD_NOT_ERASED"),
        (unknown, grpc.StatusCode.NOT_FOUND, "ERASURE_NOT_FOUND"),
        (late, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOMBSTONE"),
        (resealed(tombstone, fleet_id="fleet-b"), grpc.StatusCode.PERMISSION_DENIED,
         "FLEET_MISMATCH"),
        (resealed(tombstone, id="../../etc"), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_RECORD_ID"),
        (resealed(tombstone, importance=7.0), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_TOMBSTONE"),
        # Found in review: these reached the columns (INTERNAL on Postgres, stored on SQLite).
        (resealed(tombstone, domain="d" * 100), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_TOMBSTONE"),
        (resealed(tombstone, gate_decision_id="g" * 100), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_TOMBSTONE"),
        (resealed(tombstone, source="a\x00b"), grpc.StatusCode.INVALID_ARGUMENT,
         "NUL_CHARACTER"),  # every service's interceptor refuses NUL
        (resealed(tombstone, source="a\nb"), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_TOMBSTONE"),
        (resealed(tombstone, erased_us=4_000_000_000_000_000), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_TOMBSTONE"),
    ]
    with ShardClient(stack.shard.address, admin) as shard:
        for bad, code, reason in cases:
            with pytest.raises(EngramRpcError) as refused:
                shard.import_tombstones([tombstone, bad])  # the good one first: all or nothing
            assert (refused.value.code, refused.value.reason) == (code, reason), bad
        assert [t.id for t in shard.tombstones()] == [tombstone.id]
        assert shard.get(live.id).id == live.id
        with pytest.raises(EngramRpcError) as empty:
            shard.import_tombstones([])
        assert empty.value.reason == "EMPTY_BATCH"
        with pytest.raises(EngramRpcError) as large:  # ENGRAM_LIMITS_BATCH_ITEMS
            shard.import_tombstones([tombstone] * 1001)
        assert (large.value.code, large.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                          "BATCH_TOO_LARGE")
        for token in ("not-a-token", "x" * 2000):
            with pytest.raises(EngramRpcError) as bad_token:
                shard.call(shard.stub.ListTombstones, spb.ListTombstonesRequest(page_token=token))
            assert (bad_token.value.code, bad_token.value.reason) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN"), token
    for roles in (("governor",), ("agent",)):
        with ShardClient(stack.shard.address, make_token("op", "fleet-a", roles)) as shard:
            with pytest.raises(EngramRpcError) as denied:
                shard.import_tombstones([tombstone])
            assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
    with ShardClient(stack.shard.address, make_token("scout-1", "fleet-a")) as shard:
        with pytest.raises(EngramRpcError) as denied:
            list(shard.tombstones())
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
    with ShardClient(stack.shard.address, make_token("op", "fleet-b", ADMIN)) as shard:
        assert list(shard.tombstones()) == []  # another fleet's are not listed


def test_an_erased_run_stays_erased_on_a_target_that_never_held_it(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle made after `forget --run` holds nothing of the run; importing its erasure
    into an empty instance leaves run tombstones there (artifacts, compactor), so the run
    from a bundle made before the erasure is refused (it was accepted before: checked)."""
    admin = make_token("op", "fleet-a", ADMIN)
    before, after = tmp_path / "before.bundle", tmp_path / "after.bundle"
    with populated_origin(tmp_path, engram_home, make_token, governed=True) as origin, \
            cli_for(origin, admin, monkeypatch) as run:
        run("export", "--fleet", "fleet-a", "-o", str(before))
        run("forget", "--run", "run-1", "--reason", "the run held a secret")
        exported = run("export", "--fleet", "fleet-a", "-o", str(after))
        assert exported["rows"]["runs"] == 0 and exported["rows"]["erasures"] == 1
    with BundleReader(before) as reader:
        reader.verify()
        old_run = ParseDict(next(iter(reader.rows("runs"))), apb.Run())
        first = next(iter(reader.rows("iterations")))
    line = cpb.ImportedIteration(summary=ParseDict(
        {k: v for k, v in first.items() if k not in ("run_id", "detail_json", "guardrails_json")},
        cpb.IterationSummary()), detail_json=first.get("detail_json", ""))
    with full_stack(tmp_path / "b", engram_home, make_token, governed=True) as target:
        with cli_for(target, admin, monkeypatch) as run:
            loaded = run("import-bundle", str(after))
            assert loaded["created"]["erasures"] == 1
        with ArtifactsClient(target.artifacts.address, admin) as art:
            with pytest.raises(EngramRpcError) as refused:
                art.import_run(old_run)
            assert refused.value.reason == "RUN_ERASED"
        with CompactorClient(target.compactor.address, admin) as comp:
            with pytest.raises(EngramRpcError) as refused:
                comp.import_iterations("run-1", [line])
            assert refused.value.reason == "RUN_ERASED"


def test_an_erasure_the_origin_had_not_carried_out_is_carried_out_on_import(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted forget at the origin: the erasure is recorded, the record still there,
    so the bundle holds both. The import must not leave the record live (found in review: the
    erasure was carried out before the records came; checked failing without the last step)."""
    admin = make_token("op", "fleet-a", ADMIN)
    bundle = tmp_path / "x.bundle"
    with populated_origin(tmp_path, engram_home, make_token) as origin:
        with ShardClient(origin.shard.address, admin) as shard:
            record = next(r for r in shard.list(run_id="run-2"))
        with GovernanceClient(origin.governance.address, admin) as gov:
            gov.record_erasure("record", record.id, [gpb.ErasedItem(
                kind="record", id=record.id, leaf_hash=record.record_hash)])
        with cli_for(origin, admin, monkeypatch) as run:
            exported = run("export", "--fleet", "fleet-a", "-o", str(bundle))
            assert exported["rows"]["erasures"] == 1 and exported["rows"]["tombstones"] == 0
    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        with cli_for(target, admin, monkeypatch) as run:
            run("import-bundle", str(bundle))
        with ShardClient(target.shard.address, admin) as shard:
            with pytest.raises(EngramRpcError) as gone:
                shard.get(record.id)
            assert gone.value.reason == "RECORD_ERASED"


def test_an_erased_manifest_of_no_run_stays_erased_when_an_older_bundle_brings_it(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet bundle carries the manifests built for no run (it did not: checked), and they
    and evidence citing no artifact leave no tombstone when erased: the bundle made after
    `forget --match` carries the erasure, whose import deletes them, and importing the bundle
    made before it again has them deleted again (checked failing without the manifest and
    evidence kinds among those the import carries out)."""
    admin = make_token("op", "fleet-a", ADMIN)
    before, after = tmp_path / "before.bundle", tmp_path / "after.bundle"
    with populated_origin(tmp_path, engram_home, make_token, governed=True) as origin:
        with ArtifactsClient(origin.artifacts.address, admin) as art:
            manifest = art.create_manifest({"window": ["zqxbundled"]}).manifest
            evidence = art.create_evidence("corpus", "index", "chunk-1", 0, 1,
                                           metadata={"q": "zqxbundled"}).evidence
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", "fleet-a", "-o", str(before))
            done = run("forget", "--match", "zqxbundled")
            assert (done["manifests_erased"], done["evidence_erased"]) == (1, 1)
            run("export", "--fleet", "fleet-a", "-o", str(after))
    with full_stack(tmp_path / "b", engram_home, make_token, governed=True) as target, \
            cli_for(target, admin, monkeypatch) as run, \
            ArtifactsClient(target.artifacts.address, admin) as art:
        run("import-bundle", str(before))  # a fleet export holds its run-less manifests
        assert art.get_manifest(manifest.manifest_id) == manifest
        assert art.get_evidence(evidence.evidence_id) == evidence
        for bundle in (after, before):  # the erasure, then the older copy again
            run("import-bundle", str(bundle))
            for fetch, item_id in ((art.get_manifest, manifest.manifest_id),
                                   (art.get_evidence, evidence.evidence_id)):
                with pytest.raises(EngramRpcError) as gone:
                    fetch(item_id)
                assert gone.value.code == grpc.StatusCode.NOT_FOUND
