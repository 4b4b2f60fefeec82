"""Every connection of a service's pool in use (a flood of slow calls, a tenant's huge query):
the next call waits the pool's timeout, then gets RESOURCE_EXHAUSTED DATABASE_BUSY with a
retry delay, a status the SDK retries after that delay. Before, SQLAlchemy's TimeoutError
reached the interceptor and the caller saw INTERNAL. Once a connection comes back, calls
succeed again. SQLite and Postgres."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.exc import TimeoutError as PoolTimeout

from services.artifacts import server as artifacts_server
from services.artifacts.settings import ArtifactsSettings
from services.common.db import Database
from services.common.errors import ResourceExhausted
from services.common.tokens import write_token_file
from services.compactor import server as compactor_server
from services.compactor.repository import CompactorRepository
from services.compactor.settings import CompactorSettings
from services.governance import server as governance_server
from services.governance.settings import GovernanceSettings
from services.shard import server as shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'pool.db'}"
    else:
        url = request.getfixturevalue("fresh_postgres_url")
    db = Database(url, pool_size=1, pool_timeout=0.2)
    request.addfinalizer(db.engine.dispose)
    return db


def _hold_every_connection(db: Database, held: ExitStack) -> int:
    count = 0
    while True:
        try:
            held.enter_context(db.engine.connect())
        except PoolTimeout:
            return count
        count += 1


def _session_select(db: Database) -> None:
    with db.session() as session:
        session.execute(text("SELECT 1"))


def _reading_select(db: Database) -> None:
    with db.reading() as connection:
        connection.execute(text("SELECT 1"))


@pytest.mark.parametrize("call", [_session_select, _reading_select],
                         ids=["session", "reading"])
def test_an_exhausted_pool_is_resource_exhausted_then_recovers(
        database: Database, call: Callable[[Database], None]) -> None:
    with ExitStack() as held:
        assert _hold_every_connection(database, held) >= 1
        with pytest.raises(ResourceExhausted) as busy:
            call(database)
        assert busy.value.reason == "DATABASE_BUSY"
        assert busy.value.retry_delay and busy.value.retry_delay > 0
        assert "connection" in busy.value.message and "pool" in busy.value.message
    call(database)  # a connection came back: served again


def test_each_service_reads_its_pool_settings(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ENGRAM_SHARD_DB_POOL_SIZE", "3")
    monkeypatch.setenv("ENGRAM_SHARD_DB_POOL_TIMEOUT_SECONDS", "1.5")
    options = ShardSettings().database_options()
    assert options == {"pool_size": 3, "pool_timeout": 1.5}
    pool = Database(f"sqlite:///{tmp_path / 'set.db'}", **options).engine.pool
    assert (pool.size(), pool.timeout()) == (3, 1.5)  # type: ignore[attr-defined]
    # well under the SDK's 30 s deadline, so a refused call is retried within it
    assert GovernanceSettings().database_options() == {"pool_size": 8, "pool_timeout": 5.0}
    for name, bad in (("SIZE", "0"), ("SIZE", "many"), ("TIMEOUT_SECONDS", "0"),
                      ("TIMEOUT_SECONDS", "601")):
        monkeypatch.setenv(f"ENGRAM_SHARD_DB_POOL_{name}", bad)
        with pytest.raises(ValidationError):
            ShardSettings()
        monkeypatch.delenv(f"ENGRAM_SHARD_DB_POOL_{name}")


def test_an_erasure_s_vacuum_on_a_full_pool_is_resource_exhausted(database: Database) -> None:
    with ExitStack() as held:
        _hold_every_connection(database, held)
        with pytest.raises(ResourceExhausted) as busy:
            database.vacuum(["t"])
        assert busy.value.reason == "DATABASE_BUSY"
        assert database.checkpoint() is (database.dialect != "sqlite")  # skipped, not raised


def test_the_compactor_s_head_read_on_a_full_pool_is_resource_exhausted(
        database: Database) -> None:
    """ReconstructIteration, ListRecentIterations and VerifyRun start with it; it opened its
    own connection from the engine, and so was INTERNAL still (found by review)."""
    with ExitStack() as held:
        _hold_every_connection(database, held)
        with pytest.raises(ResourceExhausted):
            CompactorRepository(database).head("fleet-a", "run-1")


def test_every_service_builds_its_database_with_its_pool_settings(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engram_home: Path,
        make_token: TokenFactory) -> None:
    built: dict[str, dict[str, object]] = {}

    def recording(service: str) -> type[Database]:
        class Recorded(Database):
            def __init__(self, url: str, **options: Any) -> None:
                built[service] = options
                super().__init__(url, **options)
        return Recorded

    for module in (governance_server, shard_server, artifacts_server, compactor_server):
        monkeypatch.setattr(module, "Database", recording(module.__name__.split(".")[1]))
    pool = {"db_pool_size": 3, "db_pool_timeout_seconds": 1.5}
    token = tmp_path / "service.token"
    write_token_file(token, make_token("svc-compactor", "system", ("service",)))
    common = {"home": engram_home, "port": 0}
    governance_server.build_governance_server(GovernanceSettings(
        **common, db_url=f"sqlite:///{tmp_path / 'g.db'}", **pool))
    shard_server.build_shard_server(ShardSettings(
        **common, db_url=f"sqlite:///{tmp_path / 's.db'}", embedder="none",
        allow_ungated=True, index_snapshot_path=tmp_path / "s.snapshot", **pool))
    artifacts_server.build_artifacts_server(ArtifactsSettings(
        **common, db_url=f"sqlite:///{tmp_path / 'a.db'}", blob_url=(tmp_path / "b").as_uri(),
        **pool))
    compactor_server.build_compactor_server(CompactorSettings(
        **common, db_url=f"sqlite:///{tmp_path / 'c.db'}", blob_url=(tmp_path / "c").as_uri(),
        shard_addr="127.0.0.1:1", service_token_file=token, **pool))
    assert built == {name: {"pool_size": 3, "pool_timeout": 1.5}
                     for name in ("governance", "shard", "artifacts", "compactor")}
