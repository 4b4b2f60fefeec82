"""deploy/compose/init-db.sql on the real Postgres: each role opens its own database only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy
from sqlalchemy.exc import OperationalError

from tests.conftest import require
from tests.deploy.conftest import ROOT, SERVICES

pytestmark = pytest.mark.postgres
ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def prefix(postgres_available: bool) -> Iterator[str]:
    """Runs the script with its roles and databases renamed, so the cluster keeps no trace."""
    require(postgres_available, "PostgreSQL is not reachable on 127.0.0.1:5432")
    name = f"engramdeploy{uuid.uuid4().hex[:8]}_"
    sql = (ROOT / "deploy" / "compose" / "init-db.sql").read_text().replace("engram_", name)
    admin = sqlalchemy.create_engine(ADMIN, isolation_level="AUTOCOMMIT")
    code = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
    statements = [s.strip() for s in code.split(";") if s.strip()]
    try:
        with admin.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
        yield name
    finally:
        with admin.connect() as conn:
            for service in SERVICES:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}{service}" WITH (FORCE)')
                conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{name}{service}"')
        admin.dispose()


def _connect(role: str, database: str) -> sqlalchemy.Engine:
    return sqlalchemy.create_engine(f"postgresql+psycopg://{role}@127.0.0.1:5432/{database}",
                                    poolclass=sqlalchemy.pool.NullPool)


def test_each_role_owns_its_database_and_cannot_open_another(prefix: str) -> None:
    for service in SERVICES:
        own = _connect(f"{prefix}{service}", f"{prefix}{service}")
        with own.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE probe (id integer PRIMARY KEY)")
            conn.exec_driver_sql("INSERT INTO probe VALUES (1)")
        for other in SERVICES:
            if other == service:
                continue
            with pytest.raises(OperationalError, match="permission denied for database"):
                _connect(f"{prefix}{service}", f"{prefix}{other}").connect()
