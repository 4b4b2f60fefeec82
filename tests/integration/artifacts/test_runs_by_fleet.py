"""Runs are scoped by fleet (finding 8): two fleets hold runs of one id side by side, each
sees only its own, and a store made before the change keeps its data, its chains and its
blobs after the migration; over real gRPC, on SQLite and Postgres."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from engram.client._errors import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from services.artifacts.domain.chain import event_hash
from services.artifacts.server import MIGRATIONS, build_artifacts_server
from services.artifacts.settings import ArtifactsSettings
from services.artifacts.tables import Base
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from tests.integration.artifacts.conftest import RunningArtifacts


def test_two_fleets_run_the_same_run_id_apart(artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    mine, theirs = env.client_for(fleet="fleet-a"), env.client_for(fleet="fleet-b")
    first, second = mine.start_run("run-1"), theirs.start_run("run-1")
    assert first.created and second.created
    assert (first.run.fleet_id, second.run.fleet_id) == ("fleet-a", "fleet-b")
    for client, word in ((mine, "alpha"), (theirs, "beta")):
        client.append_event("run-1", "said", {"word": word}, request_id="req-1")
        client.upload(iter([word.encode()]), run_id="run-1", step_id="s", name="out.txt")
        client.create_snapshot("run-1", {"word": word}, request_id="snap-1")
        client.create_manifest({"word": word}, run_id="run-1")
    for client, word in ((mine, "alpha"), (theirs, "beta")):
        run = client.get_run("run-1")
        assert run.event_count == 1
        assert [json.loads(e.payload_json)["word"] for e in client.replay("run-1")] == [word]
        assert [json.loads(e.payload_json)["word"] for e in client.list_events("run-1")] == [word]
        (artifact,) = list(client.list_artifacts("run-1"))
        _meta, chunks = client.read(artifact.artifact_id)
        assert b"".join(chunks) == word.encode()
        view = client.rehydrate("run-1")
        assert json.loads(view.snapshot.state_json) == {"word": word}
        assert [r.run_id for r in client.list_runs()] == ["run-1"]
        client.stop_run("run-1", "succeeded")
    assert mine.get_run("run-1").status == theirs.get_run("run-1").status


def test_a_taken_run_id_in_another_fleet_says_nothing(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    mine, theirs = env.client_for(fleet="fleet-a"), env.client_for(fleet="fleet-b")
    mine.start_run("run-1")
    mine.stop_run("run-1", "failed")
    # Before, B got ALREADY_EXISTS "run 'run-1' already exists and is FAILED": A's run, told.
    assert theirs.start_run("run-1").created
    with pytest.raises(EngramRpcError) as caught:
        mine.start_run("run-1")
    assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS


# -- the migration -------------------------------------------------------------

def _config(database: Database) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    return config


def _at_revision(url: str, revision: str) -> None:
    database = Database(url)
    try:
        with database.engine.begin() as connection:
            config = _config(database)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        database.dispose()


def _old_store(url: str, blobs: Path) -> list[str]:
    """A store at revision 0001 with one run (two events, a snapshot, an artifact whose blob
    sits at the old key), made the way that revision's service wrote them; its event hashes."""
    _at_revision(url, "0001")
    hashes, prev = [], ""
    events = []
    for seq, word in ((1, "one"), (2, "two")):
        payload = json.dumps({"word": word}, separators=(",", ":"))
        digest = event_hash(prev_hash=prev, run_id="run-old", seq=seq, type="said",
                            payload_json=payload, manifest_id="", artifact_ids=(),
                            agent_id="agent-1", created_us=1_000 + seq)
        events.append({"seq": seq, "payload": payload, "prev": prev, "hash": digest,
                       "rid": f"req-{seq}"})
        hashes.append(digest)
        prev = digest
    data = b"old bytes"
    FileBlobStore(blobs).put("runs/run-old/s1/report.txt", iter([data]))
    database = Database(url)
    try:
        with database.engine.begin() as connection:
            connection.execute(text(
                "INSERT INTO runs (run_id, fleet_id, agent_id, status, stop_reason, created_us, "
                "stopped_us, event_count, head_hash, latest_snapshot_id, metadata_json) VALUES "
                "('run-old', 'fleet-a', 'agent-1', 'RUNNING', '', 1000, 0, 2, :head, 'snap_old', "
                "'{}')"), {"head": prev})
            for event in events:
                connection.execute(text(
                    "INSERT INTO events (run_id, seq, type, payload_json, manifest_id, "
                    "artifact_ids_json, created_us, agent_id, prev_hash, hash, request_id) "
                    "VALUES ('run-old', :seq, 'said', :payload, '', '[]', 1000 + :seq, "
                    "'agent-1', :prev, :hash, :rid)"), event)
            connection.execute(text(
                "INSERT INTO snapshots (snapshot_id, run_id, seq, state_json, state_hash, "
                "manifest_id, artifact_ids_json, created_us) VALUES ('snap_old', 'run-old', 2, "
                ":state, :state_hash, '', '[]', 1003)"),
                {"state": '{"n":2}', "state_hash": hashlib.sha256(b'{"n":2}').hexdigest()})
            connection.execute(text(
                "INSERT INTO artifacts (artifact_id, run_id, step_id, path, hash, mime_type, "
                "size_bytes, created_at, metadata) VALUES ('art_old', 'run-old', 's1', "
                "'runs/run-old/s1/report.txt', :hash, 'text/plain', :size, :at, :meta)"),
                {"hash": hashlib.sha256(data).hexdigest(), "size": len(data),
                 "at": datetime(2026, 1, 1, tzinfo=UTC), "meta": json.dumps({"k": 1})})
    finally:
        database.dispose()
    return hashes


@pytest.fixture(params=["sqlite", "postgres"])
def old_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def migrated(old_store_url: str, tmp_path: Path, engram_home: Path,
             make_token: Callable[..., str]) -> Iterator[tuple[Callable[[str], ArtifactsClient],
                                                                list[str], Path]]:
    blobs = tmp_path / "blobs"
    hashes = _old_store(old_store_url, blobs)
    server, _service = build_artifacts_server(ArtifactsSettings(
        home=engram_home, port=0, db_url=old_store_url, blob_url=blobs.as_uri()))
    server.start()
    clients: list[ArtifactsClient] = []

    def client_for(fleet: str) -> ArtifactsClient:
        client = ArtifactsClient(server.address, make_token("agent-1", fleet), timeout=30)
        clients.append(client)
        return client

    try:
        yield client_for, hashes, blobs
    finally:
        for client in clients:
            client.close()
        server.stop(0)


def test_migration_carries_runs_events_snapshots_and_blobs_over(
        migrated: tuple[Callable[[str], ArtifactsClient], list[str], Path]) -> None:
    client_for, hashes, _blobs = migrated
    mine = client_for("fleet-a")
    run = mine.get_run("run-old")
    assert (run.fleet_id, run.event_count, run.head_hash) == ("fleet-a", 2, hashes[-1])
    assert [e.hash for e in mine.replay("run-old")] == hashes
    assert json.loads(mine.latest_snapshot("run-old").state_json) == {"n": 2}
    artifact = mine.get_artifact("art_old")
    assert artifact.path == "runs/run-old/s1/report.txt"
    _meta, chunks = mine.read("art_old")
    assert b"".join(chunks) == b"old bytes"
    assert mine.verify("run-old").checked == 1 and not mine.verify("run-old").problems
    # Migration 0004 left them format 1 (no salt): their chained hashes are not rewritten.
    assert {(e.format, e.salt, e.payload_commitment) for e in mine.replay("run-old")} == {
        (1, "", "")}
    assert (mine.latest_snapshot("run-old").format, mine.latest_snapshot("run-old").salt) == (
        1, "")
    # The chain goes on from the old head (in format 2); an old request_id still answers with
    # its event.
    third = mine.append_event("run-old", "said", {"word": "three"}).event
    assert (third.prev_hash, third.format) == (hashes[-1], 2)
    assert [e.hash for e in mine.replay("run-old")] == [*hashes, third.hash]
    retried = mine.append_event("run-old", "said", {"word": "one"}, request_id="req-1")
    assert (retried.created, retried.event.seq) == (False, 1)
    # The old artifact's name stays taken in its run and step.
    with pytest.raises(EngramRpcError) as taken:
        mine.upload(iter([b"new"]), run_id="run-old", step_id="s1", name="report.txt")
    assert taken.value.code == grpc.StatusCode.ALREADY_EXISTS
    theirs = client_for("fleet-b")
    with pytest.raises(EngramRpcError) as hidden:
        theirs.get_artifact("art_old")
    assert hidden.value.code == grpc.StatusCode.NOT_FOUND
    assert theirs.start_run("run-old").created
    assert theirs.get_run("run-old").event_count == 0


def test_migrated_schema_is_the_tables_schema(old_store_url: str, tmp_path: Path) -> None:
    _old_store(old_store_url, tmp_path / "blobs")
    _at_revision(old_store_url, "head")
    database = Database(old_store_url)
    try:
        with database.engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": "alembic_version_artifacts"})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        database.dispose()


def test_migration_downgrades_when_no_run_id_is_shared(old_store_url: str,
                                                       tmp_path: Path) -> None:
    _old_store(old_store_url, tmp_path / "blobs")
    _at_revision(old_store_url, "head")
    database = Database(old_store_url)
    try:
        with database.engine.begin() as connection:
            config = _config(database)
            config.attributes["connection"] = connection
            command.downgrade(config, "0001")
        with database.engine.connect() as connection:
            assert connection.execute(text("SELECT COUNT(*) FROM events")).scalar() == 2
            assert connection.execute(text(
                "SELECT path FROM artifacts")).scalar() == "runs/run-old/s1/report.txt"
    finally:
        database.dispose()


def test_a_store_holding_format_2_manifests_is_not_downgraded_past_0006(
        old_store_url: str, tmp_path: Path) -> None:
    """Without its salt a format-2 manifest verifies no more: the downgrade is refused while
    one is stored, with nothing changed, and goes through once none is."""
    _at_revision(old_store_url, "head")
    database = Database(old_store_url)
    try:
        with database.engine.begin() as connection:
            connection.execute(text(
                "INSERT INTO manifests (fleet_id, manifest_id, run_id, content_json, "
                "content_hash, created_us, format, salt) VALUES ('f', 'mf_1', '', '{}', "
                "'h', 1, 2, 's')"))

        def downgrade() -> None:
            with database.engine.begin() as connection:
                config = _config(database)
                config.attributes["connection"] = connection
                command.downgrade(config, "0005")

        with pytest.raises(RuntimeError, match="format-2 manifests"):
            downgrade()
        with database.engine.connect() as connection:
            assert connection.execute(text("SELECT salt FROM manifests")).scalar() == "s"
        with database.engine.begin() as connection:
            connection.execute(text("DELETE FROM manifests"))
        downgrade()
        with database.engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("manifests")}
        assert "salt" not in columns and "format" not in columns
    finally:
        database.dispose()
