"""Migration 0006 keys revoked tokens by (fleet_id, jti): a store made before keeps its
revocations (and its chain verifies), two fleets may then revoke one jti each, and the
migrated schema is the tables' schema; on SQLite and Postgres."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import text

from services.common.db import Database
from services.governance.domain.revocation import TokenRevocation
from services.governance.server import MIGRATIONS
from services.governance.service import GovernanceService
from services.governance.tables import Base


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'governance.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


def _at_revision(url: str, revision: str) -> None:
    database = Database(url)
    try:
        with database.engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        database.dispose()


def _revocation(fleet_id: str, jti: str, by: str) -> TokenRevocation:
    return TokenRevocation(jti=jti, fleet_id=fleet_id, agent_id="", expires_ms=4_000_000_000_000,
                           revoked_ms=1_000, revoked_by=by, reason="test")


def test_revocations_made_before_stay_and_two_fleets_may_revoke_one_jti(store_url: str) -> None:
    _at_revision(store_url, "0005")
    database = Database(store_url)
    try:
        service = GovernanceService(database, lambda: 1_000)
        service.revoke_token(_revocation("fleet-a", "jti-1", "ops-a"))  # under the old key
        _at_revision(store_url, "head")
        service = GovernanceService(database, lambda: 1_000)
        stored, created = service.revoke_token(_revocation("fleet-a", "jti-1", "ops-a"))
        assert not created and stored.revoked_by == "ops-a"  # kept through the migration
        stored, created = service.revoke_token(_revocation("fleet-b", "jti-1", "ops-b"))
        assert created and stored.fleet_id == "fleet-b" and stored.revoked_by == "ops-b"
        assert set(service.access_restrictions(0).revoked_tokens) == {  # type: ignore[union-attr]
            ("fleet-a", "jti-1"), ("fleet-b", "jti-1")}
        assert service.verify()[1] == []
        with database.engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": "alembic_version_governance"})
            assert compare_metadata(context, Base.metadata) == []
            assert connection.execute(text("SELECT count(*) FROM revoked_tokens")).scalar() == 2
    finally:
        database.dispose()
