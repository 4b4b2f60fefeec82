"""The trust boundary is a process boundary: the shard cannot reach governance storage."""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.exc import ProgrammingError

from engram.cli.up import SERVICES, service_env
from services.common.db import Database
from services.governance.server import MIGRATIONS
from services.shard.settings import ShardSettings
from tests.conftest import POSTGRES_ADMIN_URL, require

ROOT = Path(__file__).resolve().parents[3]
SHARD_ROLE, GOVERNANCE_ROLE = "engram_shard", "engram_governance"


def test_shard_settings_hold_no_governance_storage(tmp_path: Path) -> None:
    fields = set(ShardSettings.model_fields)
    # How to reach governance's API (address and TLS files), never its storage.
    api = {"governance_addr", "governance_tls_ca", "governance_tls_cert", "governance_tls_key"}
    assert not {f for f in fields if "governance" in f} - api
    settings = ShardSettings(home=tmp_path)
    assert "governance" not in settings.database_url()
    shard_launch = next(s for s in SERVICES if s.name == "shard")
    env = service_env(shard_launch, tmp_path, "127.0.0.1")
    leaked = {k: v for k, v in env.items()
              if k.startswith("ENGRAM_GOVERNANCE_") or "governance.db" in v}
    assert leaked == {}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_shard_code_imports_governance_storage() -> None:
    modules = sorted((ROOT / "services" / "shard").rglob("*.py"))
    assert modules
    for module in modules:
        reached = {n for n in _imports(module) if n.startswith("services.governance")}
        assert reached == set(), f"{module.relative_to(ROOT)} imports {reached}"
        assert "governance.db" not in module.read_text()


def _ensure_role(conn: sqlalchemy.Connection, role: str) -> None:
    exists = conn.execute(sqlalchemy.text("SELECT 1 FROM pg_roles WHERE rolname = :r"),
                          {"r": role}).first()
    if exists is None:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")


@pytest.fixture
def governance_database(postgres_available: bool) -> Iterator[str]:
    require(postgres_available, "PostgreSQL is not reachable on 127.0.0.1:5432")
    name = f"engram_gov_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        _ensure_role(conn, SHARD_ROLE)
        _ensure_role(conn, GOVERNANCE_ROLE)
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" OWNER {GOVERNANCE_ROLE}')
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def test_shard_role_cannot_write_governance_tables(governance_database: str) -> None:
    as_governance = Database(f"postgresql://{GOVERNANCE_ROLE}@127.0.0.1:5432/{governance_database}")
    as_governance.upgrade(MIGRATIONS)
    with as_governance.engine.connect() as conn:
        owners = dict(conn.execute(sqlalchemy.text(
            "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'")).all())
    as_governance.dispose()
    assert {"agents", "rules", "decisions", "witness_chain", "witness_head"} <= set(owners)
    assert set(owners.values()) == {GOVERNANCE_ROLE}

    as_shard = sqlalchemy.create_engine(
        f"postgresql+psycopg://{SHARD_ROLE}@127.0.0.1:5432/{governance_database}")
    try:
        for statement in (
            "UPDATE agents SET tier = 'trusted'",
            "INSERT INTO witness_head (id, length, head) VALUES (2, 0, 'x')",
            "DELETE FROM decisions",
        ):
            with pytest.raises(ProgrammingError, match="permission denied"), \
                    as_shard.begin() as conn:
                conn.exec_driver_sql(statement)
    finally:
        as_shard.dispose()
