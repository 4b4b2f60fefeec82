"""A real governance server on 127.0.0.1:0, once per backend (SQLite file, Postgres)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engram.client import EngramRpcError
from engram.client.governance import GovernanceClient
from services.common.db import Database
from services.common.server import EngramServer
from services.governance.server import MIGRATIONS, build_governance_server
from services.governance.settings import GovernanceSettings
from tests.conftest import TokenFactory, client_factory

GovClientFactory = Callable[..., GovernanceClient]


@pytest.fixture(params=["sqlite", "postgres"])
def gov_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'governance.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def database(gov_db_url: str) -> Iterator[Database]:
    """Governance's store, migrated, for a GovernanceService in the test's own process."""
    db = Database(gov_db_url)
    db.upgrade(MIGRATIONS)
    try:
        yield db
    finally:
        db.dispose()


@pytest.fixture
def gov_settings(gov_db_url: str, engram_home: Path) -> GovernanceSettings:
    return GovernanceSettings(home=engram_home, db_url=gov_db_url, port=0)


@pytest.fixture
def governance(gov_settings: GovernanceSettings) -> Iterator[EngramServer]:
    server = build_governance_server(gov_settings)
    server.start()
    try:
        yield server
    finally:
        server.stop(0)


@pytest.fixture
def gov_for(governance: EngramServer,
            make_token: TokenFactory) -> Iterator[GovClientFactory]:
    with client_factory(lambda token: GovernanceClient(governance.address, token),
                        make_token, agent="gov-1", roles=("governor",)) as connect:
        yield connect


@pytest.fixture
def target(engram_home: Path, tmp_path: Path) -> Iterator[EngramServer]:
    """A second governance (SQLite) to import into."""
    server = build_governance_server(GovernanceSettings(
        home=engram_home, db_url=f"sqlite:///{tmp_path / 'target.db'}", port=0))
    server.start()
    try:
        yield server
    finally:
        server.stop(0)


@pytest.fixture
def governor(gov_for: GovClientFactory) -> GovernanceClient:
    return gov_for()


@pytest.fixture
def shard_service(gov_for: GovClientFactory) -> GovernanceClient:
    """The shard's principal: role "service", fleet "system"."""
    return gov_for("svc-shard", "system", ("service",))


def admin(server: EngramServer, make_token: TokenFactory, fleet: str = "fleet-a",
          role: str = "admin") -> GovernanceClient:
    return GovernanceClient(server.address, make_token("op", fleet, (role,)))


def refused(call: object, *args: object) -> EngramRpcError:
    with pytest.raises(EngramRpcError) as failure:
        call(*args)  # type: ignore[operator]
    return failure.value
