"""engram forget through real servers, on SQLite and on Postgres: a unique marker planted in a
record's content, another's tag, another's metadata, a compaction summary quoting the first,
and in a run's record, event payload, snapshot state, artifact blob, manifest, evidence and
iteration detail is gone afterwards from every byte under the data directories and
$ENGRAM_HOME (database files and their WAL, blobs, segments, the index snapshot) and from
every shard table, and so is every hash that would confirm a guess of the run's event payload,
snapshot state or iteration log without their salts (their plain SHA-256, the event's link as
a chain over the payload itself would make it, the iteration log's head as a chain over the
lines' content would: the run tombstones keep the head hashes); searches and reads
no longer return it; verification passes and counts the tombstones; the erasure is a verified
governance chain entry; a dry run changes nothing; an agent is refused; a second forget erases
nothing more; an unrelated record survives."""

from __future__ import annotations

import gzip
import hashlib
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import boto3
import grpc
import pytest
import sqlalchemy as sa
from google.protobuf.timestamp_pb2 import Timestamp
from typer.testing import CliRunner

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.cli import forget as forget_command
from engram.cli.main import app
from engram.client import EngramRpcError, ShardClient
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from services.artifacts.domain.chain import event_hash, manifest_id
from services.common.canonical import canonical_json
from services.common.db import Database, normalize_url
from services.compactor.domain.warm_chain import (
    IterationInput,
    WarmLine,
    detail_digest,
    genesis_hash,
)
from services.compactor.servicer import summary_line
from services.shard.compaction import MemoryCompactor
from services.shard.domain import records
from services.shard.erasure import RecordEraser
from services.shard.repository import ShardRepository
from services.shard.service import ShardService
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.stack import full_stack

FLEET = "fleet-e"


@pytest.fixture(params=["sqlite", "postgres"])
def urls(request: pytest.FixtureRequest) -> dict[str, str]:
    """The four stores: SQLite files (empty: the stack's defaults) or new Postgres databases."""
    if request.param == "sqlite":
        return {}
    make = request.getfixturevalue("fresh_postgres_urls")
    return {name: make() for name in ("shard", "governance", "artifacts", "compactor")}


def _files_holding(roots: list[Path], needles: list[bytes]) -> list[str]:
    """Every file's bytes and path, and a gzip file's (a cold snapshot) also decompressed."""
    hits = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                if path.suffix == ".gz":
                    data += gzip.decompress(data)
                data += str(path).lower().encode()  # its name too
                hits += [f"{path}: {n.decode()}" for n in needles if n in data.lower()]
    return hits


class _Bucket:
    """A versioned bucket on moto's S3 server that both services keep their blobs in."""

    NAME = "engram-erasure"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                               aws_access_key_id="test", aws_secret_access_key="test")

    def settings(self) -> dict[str, dict[str, str]]:
        return {"artifacts": {"blob_url": f"s3://{self.NAME}/artifacts",
                              "s3_endpoint_url": self.endpoint, "s3_region": "us-east-1",
                              "s3_access_key_id": "test", "s3_secret_access_key": "test"},
                "compactor": {"blob_url": f"s3://{self.NAME}/compactor",
                              "s3_endpoint_url": self.endpoint, "s3_region": "us-east-1",
                              "s3_access_key_id": "test", "s3_secret_access_key": "test"}}

    def holding(self, needles: list[bytes]) -> list[str]:
        """Every version of every object (key, user metadata and bytes; a gzip object also
        decompressed) and every delete marker (its key) holding a needle, and every multipart
        upload left unfinished."""
        hits = []
        for page in self.s3.get_paginator("list_object_versions").paginate(Bucket=self.NAME):
            hits += [f"s3://{self.NAME}/{m['Key']} (delete marker): {n.decode()}"
                     for m in page.get("DeleteMarkers", []) for n in needles
                     if n in m["Key"].lower().encode()]
            for version in page.get("Versions", []):
                key = version["Key"]
                got = self.s3.get_object(Bucket=self.NAME, Key=key,
                                         VersionId=version["VersionId"])
                data = got["Body"].read()
                if key.endswith(".gz"):
                    data += gzip.decompress(data)
                data += (key + json.dumps(got.get("Metadata", {}))).encode()
                hits += [f"s3://{self.NAME}/{key}: {n.decode()}"
                         for n in needles if n in data.lower()]
        uploads = self.s3.list_multipart_uploads(Bucket=self.NAME).get("Uploads", [])
        return hits + [f"s3://{self.NAME}/{u['Key']}: an unfinished upload" for u in uploads]


def _versioned_bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> _Bucket:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")  # for any client made without keys
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    bucket = _Bucket(endpoint)
    bucket.s3.create_bucket(Bucket=bucket.NAME)
    bucket.s3.put_bucket_versioning(Bucket=bucket.NAME,
                                    VersioningConfiguration={"Status": "Enabled"})
    return bucket


def _vector_ids(url: str) -> set[str]:
    """The records the shard's store holds a vector of."""
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.text("SELECT record_id FROM record_vectors")).scalars())
    finally:
        engine.dispose()


def _wait_for(check: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.1)


def _tables_holding(url: str, needles: list[str]) -> list[str]:
    engine = sa.create_engine(normalize_url(url))
    hits = []
    try:
        with engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
            for name in names:
                for row in conn.execute(sa.text(f'SELECT t::text FROM "{name}" t')):
                    hits += [f"{name}: {n}" for n in needles if n in row[0].lower()]
    finally:
        engine.dispose()
    return hits


def _no_read_returns_run_9(stack: Any, token: str, artifact_id: str,
                           evidence_id: str) -> None:
    """After its whole run was erased: its artifact's row and bytes, events, snapshots,
    rehydration, cited evidence and every iteration (hot, warm, cold) are refused (an empty
    answer would not do: it cannot tell erased from never written)."""
    with ArtifactsClient(stack.artifacts.address, token) as art:
        reads = {"artifact": lambda: art.get_artifact(artifact_id),
                 "bytes": lambda: b"".join(art.read(artifact_id)[1]),
                 "events": lambda: list(art.list_events("run-9")),
                 "snapshot": lambda: art.latest_snapshot("run-9"),
                 "snapshots": lambda: list(art.list_snapshots("run-9")),
                 "rehydrate": lambda: art.rehydrate("run-9"),
                 "evidence": lambda: art.get_evidence(evidence_id)}
        with CompactorClient(stack.compactor.address, token) as comp:
            reads |= {f"iteration {n}": lambda n=n: comp.reconstruct("run-9", n)
                      for n in (1, 25, 30)}  # cold, warm, hot
            reads |= {"recent": lambda: list(comp.recent("run-9")),
                      "summaries": lambda: list(comp.summaries("run-9"))}
            for what, read in reads.items():
                with pytest.raises(EngramRpcError) as refused:
                    read()
                assert refused.value.code in (grpc.StatusCode.NOT_FOUND,
                                              grpc.StatusCode.FAILED_PRECONDITION), what


def _guessable_hashes(event: apb.Event, snapshot: apb.Snapshot) -> list[str]:
    """What a guess of the run's event payload or snapshot state confirms without their salts:
    their plain SHA-256, and the event's chain hash (the run tombstone's head hash) as a
    payload-hashing chain would make it from the guess and the event's structural fields."""
    assert event.seq == 1  # the run's only event: its hash is the head the tombstone keeps
    return [hashlib.sha256(event.payload_json.encode()).hexdigest(),
            hashlib.sha256(snapshot.state_json.encode()).hexdigest(),
            event_hash(prev_hash=event.prev_hash, run_id=event.run_id, seq=event.seq,
                       type=event.type, payload_json=event.payload_json,
                       manifest_id=event.manifest_id, artifact_ids=tuple(event.artifact_ids),
                       agent_id=event.agent_id, created_us=event.create_time.ToMicroseconds())]


def _guessable_log(run_id: str, lines: list[cpb.IterationSummary], detail: object) -> list[str]:
    """What a guess of an iteration log (each line's fields and ``detail``) confirms without
    its salts: the detail's plain SHA-256 (a format-1 detailDigest), and the log's head as a
    chain over the lines' content (format 1) would make it, which the run tombstone would keep."""
    detail_json = canonical_json(detail)
    prev = genesis_hash(FLEET, run_id)
    for summary in lines:
        kept = summary_line(summary)
        prev = WarmLine.chained(IterationInput(
            iteration=kept.iteration, plan_digest=kept.plan_digest,
            parent_digest=kept.parent_digest, start_ts=kept.start_ts, end_ts=kept.end_ts,
            files_touched=kept.files_touched, net_add=kept.net_add, net_del=kept.net_del,
            risk_score=kept.risk_score, status=kept.status, detail_json=detail_json,
            guardrails_json="null"), kept.iteration, prev).hash
    return [detail_digest(detail_json, "null"), prev]


@pytest.mark.parametrize(("backend", "others"), [
    pytest.param("sqlite", 0, id="sqlite-index-rebuilt"),
    pytest.param("sqlite", 24, id="sqlite-index-in-place"),
    pytest.param("postgres", 0, id="postgres-index-rebuilt"),
    pytest.param("postgres", 24, id="postgres-index-in-place"),
    # blobs and cold snapshots in a versioned bucket: a plain delete would only hide them
    pytest.param("postgres-s3", 24, id="postgres-s3-index-in-place")])
def test_forget_leaves_no_byte_of_the_marker(
        backend: str, others: int, tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    sqlite = backend == "sqlite"
    make_db = None if sqlite else request.getfixturevalue("fresh_postgres_urls")
    urls = ({name: make_db() for name in ("shard", "governance", "artifacts", "compactor")}
            if make_db is not None else {})
    bucket = _versioned_bucket(request.getfixturevalue("moto_endpoint"), monkeypatch) \
        if backend.endswith("-s3") else None
    marker = "zqxmark" + secrets.token_hex(6)
    admin = make_token("op", FLEET, ADMIN)
    agent = make_token("scout-1", FLEET)
    planted = f"the launch code is {marker}, keep it"
    data = tmp_path / "data"
    blobs = bucket.settings() if bucket else {}
    shard_url = urls.get("shard", f"sqlite:///{data / 'shard.db'}")
    with full_stack(data, engram_home, make_token, urls, governed=True,
                    shard={"embedder": "hash", "allow_test_embedder": True},  # stored vectors
                    artifacts=blobs.get("artifacts"),  # sealed segments of 2-3 lines:
                    compactor={"rotate_bytes": 1024, **blobs.get("compactor", {})}) as stack:
        with ShardClient(stack.shard.address, agent) as shard:
            quoted = shard.add(planted, run_id="run-1", importance=0.1).record
            tagged = shard.add("a record tagged with the marker", run_id="run-1",
                               importance=0.9, tags=[marker]).record
            described = shard.add("a record whose metadata holds it", run_id="run-2",
                                  metadata={"note": marker}).record
            shard.add("another low note in the same run", run_id="run-1", importance=0.1)
            kept = shard.add("an unrelated lesson about idempotency keys", run_id="run-3",
                             importance=0.9).record
            shard.add(f"run nine found {marker} in the logs", run_id="run-9")
            for n in range(others):  # a fleet this size erases from its search index in place
                shard.add(f"a weather report, number {n}", run_id="run-4", importance=0.9)
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-9", {"goal": "plant"})
            blob = f"tool output with {marker}\n".encode() * 100
            uploaded = art.upload([blob], run_id="run-9", step_id="s1", name=f"{marker}.txt",
                                  sha256=hashlib.sha256(blob).hexdigest())
            event = art.append_event("run-9", "tool.called", {"query": marker}).event
            snapshot = art.create_snapshot("run-9", {"seen": marker}, seq=1)
            art.create_manifest({"files": [marker]}, run_id="run-9")
            cited = art.create_evidence("corpus-1", "index-1", "chunk-9", 0, 10,
                                        artifact_id=uploaded.artifact_id,
                                        metadata={"quote": marker}).evidence
            # held by no run: a manifest built for none, evidence citing no artifact
            loose_manifest = art.create_manifest({"window": [marker]}).manifest
            loose_evidence = art.create_evidence("corpus-2", "index-1", "chunk-1", 0, 4,
                                                 metadata={"quote": marker}).evidence
            kept_manifest = art.create_manifest({"window": ["nothing to see"]}).manifest
        with CompactorClient(stack.compactor.address, agent) as comp:
            # 25 makes a cold snapshot (a gzip blob) with the detail
            lines9 = [comp.record("run-9", iteration_from_json(
                {"iter": n, "planDigest": f"p{n}", "status": "ok",
                 "detail": {"said": marker}})).summary for n in range(1, 31)]
            lines10 = [comp.record("run-10", iteration_from_json(  # a run only the compactor
                {"iter": n, "planDigest": f"q{n}", "status": "ok",  # knows
                 "detail": {"quoted": marker.upper()}})).summary for n in range(1, 3)]
        with ShardClient(stack.shard.address, admin) as shard:
            summaries = shard.compact(importance_below=0.35, older_than_days=0).groups
            assert any(marker in g.summary.content for g in summaries)
            summary_ids = {g.summary.id for g in summaries if quoted.id in g.replaced_ids}
        assert quoted.format == 2 and quoted.salt and quoted.body_commitment

        assert event.format == 2 and event.salt and snapshot.format == 2 and snapshot.salt
        assert loose_manifest.format == 2 and loose_manifest.salt
        assert all(line.format == 2 and line.salt for line in lines9 + lines10)
        line_salts = [line.salt for line in lines9 + lines10]
        sealed = [hit for hit in (bucket.holding([salt.encode() for salt in line_salts])
                                  if bucket else _files_holding(
                                      [data / "cold"], [salt.encode() for salt in line_salts]))
                  if "/warm/segments/" in hit]
        assert len(sealed) >= 20  # run-9's lines in sealed segments
        planted_ids = {quoted.id, tagged.id, described.id, kept.id}
        _wait_for(lambda: planted_ids <= _vector_ids(shard_url), "the records' vectors")
        needles = [marker, hashlib.sha256(planted.encode()).hexdigest(),
                   *_guessable_hashes(event, snapshot),
                   *_guessable_log("run-9", lines9, {"said": marker}),
                   *_guessable_log("run-10", lines10, {"quoted": marker.upper()}),
                   event.salt, snapshot.salt, *line_salts,  # erased with what holds them
                   hashlib.sha256(blob).hexdigest(),  # the artifact row's plain hash
                   # what a manifest id or hash derived from the content would be, its salt
                   hashlib.sha256(loose_manifest.content_json.encode()).hexdigest()[:40],
                   loose_manifest.salt]
        if sqlite:  # as an autocheckpoint would: the pages reach the main file
            with closing(sqlite3.connect(data / "shard.db")) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # the scans below can fail: before the erasure they find the marker
        if bucket:  # the blob, the cold snapshot
            assert {hit.split("/")[3] for hit in bucket.holding([marker.encode()])} \
                == {"artifacts", "compactor"}
            assert not _files_holding([data / "cold", data / "blobs"], [marker.encode()])
        else:
            assert _files_holding([data / "cold"], [marker.encode()])
        if sqlite:
            assert _files_holding([data], [marker.encode()])
        else:
            assert _tables_holding(urls["shard"], needles)
            assert _tables_holding(urls["artifacts"], [marker])
        blob_hash = hashlib.sha256(blob).hexdigest()  # in the artifact's row until erased
        assert (_files_holding([data], [blob_hash.encode()]) if sqlite
                else _tables_holding(urls["artifacts"], [blob_hash]))
        salts = [event.salt, snapshot.salt]
        assert {hit.rsplit(": ", 1)[1] for hit in (
            _files_holding([data], [salt.encode() for salt in salts]) if sqlite
            else _tables_holding(urls["artifacts"], salts))} == set(salts)
        # the lines' salts are in the compactor's store (database, segments, snapshots)
        found = _files_holding([data], [salt.encode() for salt in line_salts])
        if not sqlite:
            found += _tables_holding(urls["compactor"], line_salts)
        if bucket:
            found += bucket.holding([salt.encode() for salt in line_salts])
        assert {hit.rsplit(": ", 1)[1] for hit in found} == set(line_salts)

        with cli_for(stack, agent, monkeypatch) as run:  # an agent may not erase
            run("forget", "--match", marker, code=2)
        with cli_for(stack, admin, monkeypatch) as run:
            before = tmp_path / "before.bundle"  # the scan of the later export can fail
            run("export", "--fleet", FLEET, "-o", str(before))
            assert _files_holding([before], [marker.encode()])
            before.unlink()
            holding = run("forget", "--match", marker, "--dry-run")["runs_holding_text"]
            assert holding == ["run-9"]  # run-10's lines are format 2: erasable in place
            run_dry = run("forget", "--run", "run-9", "--dry-run")["would_erase"]
            assert {i["kind"] for i in run_dry} == {"record", "run", "iterations"}
            assert run("forget", "--run", "run-9")["erased"] == 1
            with ArtifactsClient(stack.artifacts.address, admin) as art:
                with pytest.raises(EngramRpcError) as gone:
                    art.get_run("run-9")
                assert gone.value.reason == "RUN_ERASED"
            with CompactorClient(stack.compactor.address, agent) as comp:
                with pytest.raises(EngramRpcError) as closed:
                    comp.record("run-9", iteration_from_json(
                        {"iter": 31, "planDigest": "p31", "status": "ok"}))
                assert closed.value.reason == "RUN_ERASED"
            dry = run("forget", "--match", marker, "--dry-run")
            would = {item["id"] for item in dry["would_erase"]}
            loose = {loose_manifest.manifest_id, loose_evidence.evidence_id}
            in_place = {"run-10:1", "run-10:2"}  # --whole-runs erases the log instead
            assert would == {quoted.id, tagged.id, described.id} | summary_ids | loose | in_place
            would -= in_place
            with ShardClient(stack.shard.address, admin) as shard:
                assert shard.get(quoted.id).content == planted  # the dry run changed nothing
            done = run("forget", "--match", marker, "--reason", "subject asked",
                       "--whole-runs")
            assert done["erased"] == len(would) - len(loose)
            assert (done["manifests_erased"], done["evidence_erased"]) == (1, 1)
            assert [log["run_id"] for log in done["erasures"][0]["iteration_logs"]] == ["run-10"]
            assert done["runs_holding_text"] == []
            assert run("forget", "--match", marker) == {
                "erased": 0, "events_erased": 0, "snapshots_erased": 0, "manifests_erased": 0,
                "evidence_erased": 0, "iterations_erased": 0, "erasures": [],
                "runs_holding_text": [],
                "format1_events_left": [], "format1_records": [], "format1_manifests": []}
            again = run("forget", "--record", quoted.id)
            assert again["erased"] == 0
            resumed = run("forget", "--resume", done["erasures"][0]["erasure_id"])
            # not [] ("nothing left"): a resume cannot tell, the text is recorded nowhere
            assert (resumed["runs_holding_text"], resumed["format1_events_left"]) == (None, None)
            assert resumed["erasures"][0]["records"] == []
            assert resumed["erasures"][0]["already_erased"] == len(would) - len(loose)
            assert resumed["erasures"][0]["manifests_erased"] == 0
            with ArtifactsClient(stack.artifacts.address, admin) as art:
                for fetch, item_id in ((art.get_manifest, loose_manifest.manifest_id),
                                       (art.get_evidence, loose_evidence.evidence_id)):
                    with pytest.raises(EngramRpcError) as gone:
                        fetch(item_id)
                    assert gone.value.code == grpc.StatusCode.NOT_FOUND
                assert art.get_manifest(kept_manifest.manifest_id) == kept_manifest
                checked = art.verify()  # run-9 as a tombstone its erasure lists
                assert (checked.runs_tombstoned, checked.tombstones_unconfirmed) == (1, 0)
                assert not checked.tombstone_problems and not checked.problems
            _no_read_returns_run_9(stack, admin, uploaded.artifact_id, cited.evidence_id)
            bundle = tmp_path / "after.bundle"
            run("export", "--fleet", FLEET, "-o", str(bundle))

        erasure_id = done["erasures"][0]["erasure_id"]
        with ShardClient(stack.shard.address, admin) as shard:
            assert not shard.search(marker, mode="lexical", limit=20)
            assert not shard.search("launch code", mode="lexical", limit=20)
            with pytest.raises(EngramRpcError) as erased:
                shard.get(quoted.id)
            assert erased.value.code == grpc.StatusCode.NOT_FOUND
            assert erased.value.reason == "RECORD_ERASED"
            assert [h.record.id for h in shard.search("idempotency keys", mode="lexical")] \
                == [kept.id]
            report = shard.verify(all_records=True)
            assert not report.failures
            assert report.tombstoned == len(would) - len(loose) + 1  # and run-9's record
            for size in (1, 2):  # paged: records, then tombstones, across page boundaries
                pages = list(shard.verify_pages(size))
                assert sum(p.tombstoned for p in pages) == report.tombstoned
                assert sum(p.checked for p in pages) == report.checked
                assert all(p.checked + p.tombstoned <= size for p in pages)
            assert shard.verify([quoted.id]).tombstoned == 1
            # the carried-out erasure again: nothing more
            assert not shard.forget(erasure_id=erasure_id).records
        with GovernanceClient(stack.governance.address, admin) as gov:
            recorded = gov.erasure(erasure_id)
            assert recorded.selector_kind == "match" and recorded.selector_value == ""
            assert {i.id for i in recorded.items} == would | {"run-10"}
            assert recorded.reason == "subject asked" and recorded.requested_by == "op"
            assert gov.verify_chain().ok
        with GovernanceClient(stack.governance.address, agent) as gov:
            with pytest.raises(EngramRpcError) as refused:
                gov.record_erasure("record", kept.id, [gpb.ErasedItem(
                    kind="record", id=kept.id, leaf_hash=kept.record_hash)])
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED

        assert _files_holding([data, engram_home, bundle], [n.encode() for n in needles]) == []
        for url in urls.values():  # every table of every service, cast to text
            assert _tables_holding(url, needles) == []
        vectors = _vector_ids(shard_url)
        assert kept.id in vectors and not vectors & would
        if bucket:  # every version of every object, and no upload left unfinished
            assert bucket.holding([n.encode() for n in needles]) == []
    # stopping saves the index snapshot again: still nothing
    assert _files_holding([data, engram_home], [n.encode() for n in needles]) == []


def test_bad_forget_requests_are_refused(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin = make_token("op", FLEET, ADMIN)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ShardClient(stack.shard.address, make_token("scout-1", FLEET)) as shard:
            kept = shard.add("a lesson nobody asked to erase").record
        with GovernanceClient(stack.governance.address, make_token("op", "fleet-o", ADMIN)) as g:
            foreign = g.record_erasure("record", kept.id, [gpb.ErasedItem(
                kind="record", id=kept.id, leaf_hash=kept.record_hash)]).erasure
        cases: list[tuple[dict[str, object], grpc.StatusCode, str]] = [
            ({}, grpc.StatusCode.INVALID_ARGUMENT, "SELECTOR_REQUIRED"),
            ({"match": ""}, grpc.StatusCode.INVALID_ARGUMENT, "SELECTOR_REQUIRED"),
            ({"match": "x" * 1001}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SELECTOR"),
            ({"agent_id": "a b"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER"),
            ({"run_id": "r", "limit": 10_001}, grpc.StatusCode.INVALID_ARGUMENT,
             "INVALID_LIMIT"),
            ({"erasure_id": "era_nope"}, grpc.StatusCode.NOT_FOUND, "ERASURE_NOT_FOUND"),
            ({"erasure_id": foreign.erasure_id}, grpc.StatusCode.NOT_FOUND,
             "ERASURE_NOT_FOUND"),  # another fleet's: absent, its fleet not named
            ({"erasure_id": "era_x", "record_id": kept.id}, grpc.StatusCode.INVALID_ARGUMENT,
             "INVALID_SELECTOR"),
            ({"fleet_id": "fleet-o", "record_id": kept.id}, grpc.StatusCode.PERMISSION_DENIED,
             "FLEET_MISMATCH"),
            ({"match": "lesson", "page_token": "garbage"}, grpc.StatusCode.INVALID_ARGUMENT,
             "INVALID_PAGE_TOKEN"),
            ({"match": "lesson", "page_token": "x" * 5000}, grpc.StatusCode.INVALID_ARGUMENT,
             "INVALID_PAGE_TOKEN"),
            ({"erasure_id": "era_x", "page_token": "t"}, grpc.StatusCode.INVALID_ARGUMENT,
             "INVALID_SELECTOR"),
        ]
        with ShardClient(stack.shard.address, admin) as shard:
            for fields, code, reason in cases:
                with pytest.raises(EngramRpcError) as refused:
                    shard.forget(**fields)  # type: ignore[arg-type]
                assert (refused.value.code, refused.value.reason) == (code, reason), fields
            assert shard.get(kept.id).content  # nothing was erased


def test_forget_an_agent_takes_its_records_and_the_runs_it_started(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", FLEET, ADMIN)
    leaving, staying = make_token("scout-2", FLEET), make_token("scout-3", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        for token, run_id in ((leaving, "run-a"), (staying, "run-b")):
            with ShardClient(stack.shard.address, token) as shard:
                shard.add(f"a note in {run_id}", run_id=run_id, request_id=f"req-{run_id}")
            with ArtifactsClient(stack.artifacts.address, token) as art:
                art.start_run(run_id, {})
                art.append_event(run_id, "tool.called", {"by": run_id})
            with CompactorClient(stack.compactor.address, token) as comp:
                comp.record(run_id, iteration_from_json({"iter": 1, "planDigest": "p",
                                                         "status": "ok"}))
        with cli_for(stack, admin, monkeypatch) as run:
            dry = run("forget", "--agent", "scout-2", "--dry-run")["would_erase"]
            assert sorted(i["kind"] for i in dry) == ["iterations", "record", "run"]
            assert run("forget", "--agent", "scout-2")["erased"] == 1
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            with pytest.raises(EngramRpcError) as gone:
                art.get_run("run-a")
            assert gone.value.reason == "RUN_ERASED"
            assert art.get_run("run-b").event_count >= 1
        with ShardClient(stack.shard.address, admin) as shard:
            assert [h.record.agent_id for h in shard.search("note", mode="lexical")] \
                == ["scout-3"]
        with ShardClient(stack.shard.address, leaving) as shard:
            # the request claim (a digest of the body) went with the record: a retry of the
            # old request writes anew, through the gate, instead of answering with nothing
            again = shard.add("a note in run-a", run_id="run-a", request_id="req-run-a")
            assert again.created


def test_forget_match_whole_runs_erases_a_run_holding_the_text_in_its_metadata_or_stop_reason(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """StartRun's metadata and StopRun's reason are the run's data too (GetRun and ListRuns
    hand them to every agent of the fleet): FindRuns names a run holding the text only there,
    case-folded as elsewhere, and --whole-runs erases it."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    marker = "jane.doe@example.com"
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-meta", {"customer": marker.upper()})
            art.start_run("run-stopped", {"goal": "triage"})
            art.start_run("run-kept", {"customer": "someone else"})
            for run_id in ("run-meta", "run-stopped", "run-kept"):
                art.append_event(run_id, "tool.called", {"q": "nothing to see"})
            art.stop_run("run-stopped", "failed", reason=f"mail to {marker} bounced")
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            found = {r.run_id: list(r.places) for r in art.find_runs(marker).runs}
            # the reason is also in the stop event StopRun appends
            assert found == {"run-meta": ["run metadata"],
                             "run-stopped": ["run stop_reason", "event 2"]}
        with cli_for(stack, admin, monkeypatch) as run:
            assert run("forget", "--match", marker, "--dry-run")["runs_holding_text"] \
                == ["run-meta", "run-stopped"]
            done = run("forget", "--match", marker, "--whole-runs")
            assert done["runs_holding_text"] == []
            assert sorted(r["run_id"] for r in done["erasures"][0]["runs"]) \
                == ["run-meta", "run-stopped"]
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            for run_id in ("run-meta", "run-stopped"):
                with pytest.raises(EngramRpcError) as gone:
                    art.get_run(run_id)
                assert gone.value.reason == "RUN_ERASED"
            assert art.get_run("run-kept").event_count == 1
            assert not art.find_runs(marker).runs


def test_a_write_racing_the_erasure_of_the_record_it_lands_on_never_revives_its_id(
        urls: dict[str, str], tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same text written again by its author finds its record through the write key; an
    erasure committing between that lookup and the commit used to let the write store the text
    again under the erased id (no tombstone check on writes): searchable again, and counted as
    "already erased" by every later erasure. It is now written anew under a new id."""
    admin = make_token("op", FLEET, ADMIN)
    author = make_token("scout-4", FLEET)
    text = "the launch code is 0000, written twice"
    with full_stack(tmp_path / "data", engram_home, make_token, urls,
                    governed=True) as stack:
        with ShardClient(stack.shard.address, author) as shard:
            first = shard.add(text, run_id="run-x").record
        assign = ShardService._assign_ids
        erased: list[str] = []

        def assign_then_erase(self: ShardService, *args: Any) -> Any:
            found = assign(self, *args)
            if not erased:  # the erasure commits after the write found its record
                erased.append(first.id)
                with cli_for(stack, admin, monkeypatch) as run:
                    assert run("forget", "--record", first.id)["erased"] == 1
            return found

        monkeypatch.setattr(ShardService, "_assign_ids", assign_then_erase)
        with ShardClient(stack.shard.address, author) as shard:
            again = shard.add(text, run_id="run-x").record
        monkeypatch.undo()
        assert erased == [first.id] and again.id != first.id
        with ShardClient(stack.shard.address, admin) as shard:
            with pytest.raises(EngramRpcError) as gone:
                shard.get(first.id)
            assert gone.value.reason == "RECORD_ERASED"
            assert shard.get(again.id).content == text
            assert [h.record.id for h in shard.search("launch code", mode="lexical")] \
                == [again.id]


def _low_notes(stack: Any, token: str, marker: str) -> Any:
    with ShardClient(stack.shard.address, token) as shard:
        secret = shard.add(f"the door code is {marker}", run_id="run-c", importance=0.1).record
        shard.add("another low note of the same run", run_id="run-c", importance=0.1)
    return secret


def test_a_compaction_racing_the_erasure_of_an_original_stores_no_summary_of_it(
        urls: dict[str, str], tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction reads its candidates, then writes each group's summary (their text): an
    erasure of an original committing in between used to end with a summary quoting erased
    text, stored and searchable, that no erasure listed. The summary's commit now marks its
    originals under lock and is refused when one is gone; the group waits for a later run."""
    admin = make_token("op", FLEET, ADMIN)
    marker = "zq" + secrets.token_hex(6)
    with full_stack(tmp_path / "data", engram_home, make_token, urls,
                    governed=True) as stack:
        secret = _low_notes(stack, make_token("scout-5", FLEET), marker)
        candidates = MemoryCompactor.candidates

        def then_erased(self: MemoryCompactor, *args: Any) -> Any:
            found = candidates(self, *args)
            with cli_for(stack, admin, monkeypatch) as run:
                assert run("forget", "--record", secret.id)["erased"] == 1
            return found

        monkeypatch.setattr(MemoryCompactor, "candidates", then_erased)
        with ShardClient(stack.shard.address, admin) as shard:
            report = shard.compact(importance_below=0.35, older_than_days=0)
        monkeypatch.undo()
        assert not [g for g in report.groups if secret.id in g.replaced_ids]
        with ShardClient(stack.shard.address, admin) as shard:
            assert not [r for r in shard.list(page_size=100) if marker in r.content]
            assert not shard.search(marker, mode="lexical")


def test_an_erasure_refuses_when_a_summary_quoting_its_records_came_after_its_selection(
        urls: dict[str, str], tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`forget` selects (the record and the summaries quoting it), governance records that,
    then the shard erases: a compaction in between wrote a summary quoting the record that the
    erasure does not list. Erasing the record alone left its text in that summary; the shard
    now refuses (FAILED_PRECONDITION ERASURE_INCOMPLETE, nothing erased) and a second forget
    selects the summary too."""
    admin = make_token("op", FLEET, ADMIN)
    marker = "zq" + secrets.token_hex(6)
    with full_stack(tmp_path / "data", engram_home, make_token, urls,
                    governed=True) as stack:
        secret = _low_notes(stack, make_token("scout-6", FLEET), marker)
        select = RecordEraser.select

        def then_compacted(self: RecordEraser, *args: Any) -> Any:
            chosen = select(self, *args)
            with ShardClient(stack.shard.address, admin) as shard:
                assert shard.compact(importance_below=0.35, older_than_days=0).groups
            return chosen

        monkeypatch.setattr(RecordEraser, "select", then_compacted)
        with cli_for(stack, admin, monkeypatch) as run:
            refused = run("forget", "--record", secret.id, code=2)
        assert "ERASURE_INCOMPLETE" in json.dumps(refused), refused
        monkeypatch.undo()
        with ShardClient(stack.shard.address, admin) as shard:
            assert shard.get(secret.id).content  # nothing was erased
        with cli_for(stack, admin, monkeypatch) as run:
            assert run("forget", "--record", secret.id)["erased"] == 2  # the summary too
        with ShardClient(stack.shard.address, admin) as shard:
            assert not [r for r in shard.list(page_size=100) if marker in r.content]


def test_the_same_erasure_carried_out_twice_at_once_erases_once(
        urls: dict[str, str], tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    """An operator's rerun, or the SDK's retry after a lost reply, can carry out an erasure
    while the first call still runs: both read "not done", and the second's tombstones hit
    the first's keys (INTERNAL). The eraser now holds the write lock from its first read."""
    admin = make_token("op", FLEET, ADMIN)
    author = make_token("scout-7", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, urls,
                    governed=True) as stack:
        with ShardClient(stack.shard.address, author) as shard:
            notes = [shard.add(f"note {i} to forget twice", run_id="run-t").record
                     for i in range(8)]
        with GovernanceClient(stack.governance.address, admin) as gov:
            erasures = [gov.record_erasure("record", n.id, [gpb.ErasedItem(
                kind="record", id=n.id, leaf_hash=n.record_hash)]).erasure.erasure_id
                for n in notes]
        outcomes: list[tuple[int, int] | str] = []

        def carry_out(erasure_id: str, start: threading.Barrier) -> None:
            with ShardClient(stack.shard.address, admin) as shard:
                start.wait()
                try:
                    reply = shard.forget(erasure_id=erasure_id)
                    outcomes.append((len(reply.records), reply.already_erased))
                except EngramRpcError as error:
                    outcomes.append(f"{error.code.name} {error.reason}")

        for erasure_id in erasures:
            start = threading.Barrier(2)
            both = [threading.Thread(target=carry_out, args=(erasure_id, start))
                    for _ in range(2)]
            for thread in both:
                thread.start()
            for thread in both:
                thread.join(timeout=60)
        assert sorted(map(str, outcomes)) == sorted(map(str, [(0, 1), (1, 0)] * len(erasures))), \
            outcomes


def test_a_record_written_after_the_newest_records_were_erased_is_searchable(
        urls: dict[str, str], tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite gives a new row the highest rowid + 1: after the newest record was erased, the
    next write got its seq again, which the search index's cursor had already passed, so the
    new record was stored but never searchable (until the index was rebuilt)."""
    admin = make_token("op", FLEET, ADMIN)
    author = make_token("scout-8", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, urls,
                    governed=True) as stack:
        for i in range(3):
            with ShardClient(stack.shard.address, author) as shard:
                newest = shard.add(f"the vault note {i} that goes", run_id="run-s").record
            with cli_for(stack, admin, monkeypatch) as run:
                assert run("forget", "--record", newest.id)["erased"] == 1
            with ShardClient(stack.shard.address, author) as shard:
                kept = shard.add(f"the ledger entry {i} that stays", run_id="run-s").record
                hits = shard.search(f"ledger entry {i}", mode="lexical")
                assert kept.id in [h.record.id for h in hits], i


def test_a_selection_counts_the_summaries_it_adds_against_its_limit(
        urls: dict[str, str], tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The summaries quoting the selected records came on top of `limit`: a subject with as
    many records as one erasure takes, plus a summary, could never be erased (governance
    refuses an erasure of more items, ERASURE_TOO_LARGE)."""
    admin = make_token("op", FLEET, ADMIN)
    with full_stack(tmp_path / "data", engram_home, make_token, urls,
                    governed=True) as stack:
        with ShardClient(stack.shard.address, make_token("scout-9", FLEET)) as shard:
            for i in range(3):
                shard.add(f"project note {i} for the rollout plan", run_id="run-l",
                          importance=0.1, domain="projects")
        with ShardClient(stack.shard.address, admin) as shard:
            groups = shard.compact(importance_below=0.35, older_than_days=0).groups
            assert len(groups) == 1 and len(groups[0].replaced_ids) == 3
            selection = shard.forget(run_id="run-l", limit=2)
            assert len(selection.records) <= 2 and selection.more
            assert [r.kind for r in selection.records].count("summary") == 1
        with cli_for(stack, admin, monkeypatch) as run:
            assert run("forget", "--run", "run-l")["erased"] == 4


def test_a_selection_pages_with_tokens_and_a_dry_run_lists_every_page(
        urls: dict[str, str], tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ForgetRecords' selection names the next page (records past the last listed, nothing
    erased between); a token is good only for its own selector and caller; ``forget
    --dry-run`` lists every page (before, the first page and ``incomplete``), and the
    erasure then erases all of them."""
    admin = make_token("op", FLEET, ADMIN)
    with full_stack(tmp_path / "data", engram_home, make_token, urls,
                    governed=True) as stack:
        with ShardClient(stack.shard.address, make_token("scout-1", FLEET)) as shard:
            ids = [shard.add(f"zqxsel note {i}", run_id="run-s").record.id for i in range(5)]
            shard.add("unrelated note", run_id="run-s")
        with ShardClient(stack.shard.address, admin) as shard:
            listed, token = [], ""
            while True:
                page = shard.forget(match="ZQXSEL", limit=2, page_token=token)
                assert page.more == bool(page.next_page_token) and len(page.records) <= 2
                listed += [r.record_id for r in page.records]
                if not page.next_page_token:
                    break
                token = page.next_page_token
            assert listed == ids
            for fields in ({"match": "other"}, {"run_id": "run-s"}):
                with pytest.raises(EngramRpcError) as refused:
                    shard.forget(**fields, limit=2, page_token=token)  # type: ignore[arg-type]
                assert refused.value.reason == "INVALID_PAGE_TOKEN"
        with ShardClient(stack.shard.address, make_token("op-2", FLEET, ADMIN)) as shard:
            with pytest.raises(EngramRpcError) as refused:
                shard.forget(match="ZQXSEL", limit=2, page_token=token)
            assert refused.value.reason == "INVALID_PAGE_TOKEN"
        monkeypatch.setattr(forget_command, "ROUND", 2)
        monkeypatch.setattr(forget_command, "EXTRA_PER_ROUND", 1)
        with cli_for(stack, admin, monkeypatch) as run:
            dry = run("forget", "--match", "zqxsel", "--dry-run")
            assert [i["id"] for i in dry["would_erase"]] == ids
            assert run("forget", "--match", "zqxsel")["erased"] == 5
            assert run("forget", "--match", "zqxsel", "--dry-run")["would_erase"] == []


def test_forget_a_run_with_no_events_yet(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run just started holds its metadata (and may hold manifests and artifacts) but no
    event, so its head hash is empty: the erasure governance refuses an empty leaf
    (INVALID_ITEM), and --run and --agent could not erase it. It is listed with
    EMPTY_RUN_LEAF; once it has events, the old leaf no longer matches."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    marker = "jane.doe@example.com"
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-empty", {"customer": marker})
            art.start_run("run-other", {"customer": "someone else"})
        with cli_for(stack, admin, monkeypatch) as run:
            planned = run("forget", "--run", "run-empty", "--dry-run")["would_erase"]
            assert [(i["kind"], i["leaf_hash"]) for i in planned] == [("run", "0" * 64)]
            done = run("forget", "--run", "run-empty")
            assert [r["run_id"] for r in done["erasures"][0]["runs"]] == ["run-empty"], done
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            with pytest.raises(EngramRpcError) as gone:
                art.get_run("run-empty")
            assert gone.value.reason == "RUN_ERASED"
            assert not art.find_runs(marker).runs
            assert art.get_run("run-other").event_count == 0


def test_an_erasure_failing_after_governance_recorded_it_names_itself_and_resume_finishes_it(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A service failing between governance's record of an erasure and its carrying out left
    the operator with no id to give --resume: no command lists erasures, and the error did not
    name it (found in review, 2026-11-30). The error names it now, in its message and its
    metadata."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ShardClient(stack.shard.address, agent) as shard:
            secret = shard.add("the vault code is 4711", run_id="run-v").record
        carry_out = forget_command._Services.carry_out
        recorded: list[str] = []

        def unreachable(self: Any, erasure_id: str, kinds: set[str]) -> dict[str, Any]:
            recorded.append(erasure_id)  # as if the shard went away after governance answered
            raise EngramRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all "
                                 "addresses")

        with cli_for(stack, admin, monkeypatch) as run:
            monkeypatch.setattr(forget_command._Services, "carry_out", unreachable)
            failed = run("forget", "--record", secret.id, code=2)["error"]
            assert failed["code"] == "UNAVAILABLE"
            assert failed["metadata"]["erasure_id"] == recorded[0]
            assert f"engram forget --resume {recorded[0]}" in failed["message"]
            monkeypatch.setattr(forget_command._Services, "carry_out", carry_out)
            finished = run("forget", "--resume", recorded[0])
            assert finished["erased"] == 1
        with ShardClient(stack.shard.address, admin) as shard:
            with pytest.raises(EngramRpcError) as gone:
                shard.get(secret.id)
            assert gone.value.code == grpc.StatusCode.NOT_FOUND


def test_an_erasure_interrupted_while_carried_out_names_itself(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C between governance's record of an erasure and its carrying out exited 130 with
    nothing said: no id to give --resume (found in review, 2026-11-30)."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ShardClient(stack.shard.address, agent) as shard:
            secret = shard.add("the vault code is 4711", run_id="run-v").record
        recorded: list[str] = []

        def interrupted(self: Any, erasure_id: str, kinds: set[str]) -> dict[str, Any]:
            recorded.append(erasure_id)
            raise KeyboardInterrupt

        with cli_for(stack, admin, monkeypatch) as run:
            monkeypatch.setattr(forget_command._Services, "carry_out", interrupted)
            result = CliRunner().invoke(app, ["forget", "--record", secret.id])
            # and the fleet's erasures are listed (no command did before)
            [listed] = run("gov", "erasures")
            table = CliRunner().invoke(app, ["gov", "erasures"])
        output = result.output + (result.stderr if result.stderr_bytes else "")
        assert result.exit_code == 130, output
        assert f"engram forget --resume {recorded[0]}" in " ".join(output.split())
        assert (listed["erasure_id"], listed["selector_kind"], listed["item_count"]) == (
            recorded[0], "record", 1)
        assert "items" not in listed
        assert table.exit_code == 0 and recorded[0] in table.output, table.output


def test_forget_names_the_records_written_before_format_2_it_erases(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A record and a manifest of no run stored before salted commitments (ids derived from
    their content) are erased like any other, and the dry run and the erasure name them: what
    is left of them can be checked against a guess of the text, which an operator must know."""
    admin = make_token("op", FLEET, ADMIN)
    data = tmp_path / "data"
    text = "zqxold the vendor's private number"
    sha = records.content_hash(text)
    old = records.seal(records.Record(
        id=records.record_id(FLEET, "run-old", "scout-1", sha), fleet_id=FLEET,
        run_id="run-old", agent_id="scout-1", content=text, content_hash=sha, record_hash="",
        domain="insights", source="manual", importance=0.5, tags=(), metadata={},
        cross_refs=(), created_us=1_700_000_000_000_000))
    with full_stack(data, engram_home, make_token, governed=True) as stack:
        with ShardClient(stack.shard.address, make_token("scout-1", FLEET)) as shard:
            new = shard.add("zqxold a note written now", run_id="run-new").record
        manifest_text = '{"window":["zqxold"]}'
        with ArtifactsClient(stack.artifacts.address, admin) as art:  # as a bundle brings it
            art.import_run_items(manifests=[apb.Manifest(
                manifest_id=manifest_id(manifest_text), content_json=manifest_text,
                content_hash=hashlib.sha256(manifest_text.encode()).hexdigest(),
                create_time=Timestamp(seconds=1_700_000_000))])
            fresh = art.create_manifest({"window": ["zqxold now"]}).manifest
        database = Database(f"sqlite:///{data / 'shard.db'}")
        with database.session() as session:  # as the upgrade found it
            ShardRepository(database.dialect).insert(session, [old])
        database.engine.dispose()
        with cli_for(stack, admin, monkeypatch) as run:
            dry = run("forget", "--match", "zqxold", "--dry-run")
            assert {i["id"] for i in dry["would_erase"]} == {
                old.id, new.id, manifest_id(manifest_text), fresh.manifest_id}
            assert dry["format1_records"] == [old.id]
            assert dry["format1_manifests"] == [manifest_id(manifest_text)]
            done = run("forget", "--match", "zqxold")
            assert (done["erased"], done["manifests_erased"]) == (2, 2)
            assert done["format1_records"] == [old.id]
            assert done["format1_manifests"] == [manifest_id(manifest_text)]
        with ShardClient(stack.shard.address, admin) as shard:
            for record_id in (old.id, new.id):
                with pytest.raises(EngramRpcError) as gone:
                    shard.get(record_id)
                assert gone.value.reason == "RECORD_ERASED"
