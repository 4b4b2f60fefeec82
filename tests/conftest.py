"""Fixtures every test suite shares: a signing key, tokens, Postgres databases."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import jwt
import pytest

from engram.client import BaseClient
from services.common.auth import service_principal
from services.common.tokens import (
    AUDIENCES,
    DEFAULT_AGENT_TTL_SECONDS,
    TokenSigner,
    ensure_keypair,
)


def require(available: bool, what: str) -> None:
    """Skip locally when a real dependency is missing; in CI (CI=true) that is a failure."""
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} in CI")
    pytest.skip(what)


POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

TokenFactory = Callable[..., str]
Client = TypeVar("Client", bound=BaseClient)


@contextmanager
def client_factory(
    build: Callable[[str], Client],
    make_token: TokenFactory,
    *,
    agent: str = "agent-1",
    fleet: str = "fleet-a",
    roles: tuple[str, ...] = ("agent",),
) -> Iterator[Callable[..., Client]]:
    """``connect(agent, fleet, roles)`` builds a client with a token for that principal;
    every client it built is closed at the end."""
    opened: list[Client] = []

    def connect(agent: str = agent, fleet: str = fleet,
                roles: tuple[str, ...] = roles) -> Client:
        client = build(make_token(agent, fleet, roles))
        opened.append(client)
        return client

    try:
        yield connect
    finally:
        for client in opened:
            client.close()


@pytest.fixture(scope="session")
def engram_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("engram-home")
    ensure_keypair(home)
    return home


@pytest.fixture(scope="session")
def make_token(engram_home: Path) -> TokenFactory:
    signer = TokenSigner.load(engram_home / "auth" / "signing.key")

    def issue(
        agent: str = "agent-1", fleet: str = "fleet-a", roles: tuple[str, ...] = ("agent",),
        *, ttl_seconds: int = DEFAULT_AGENT_TTL_SECONDS, audience: tuple[str, ...] = AUDIENCES,
    ) -> str:
        return signer.issue(agent, fleet, set(roles), ttl_seconds=ttl_seconds, audience=audience)

    return issue


def inspect_token(token: str) -> dict[str, Any]:
    """A token's header and claims, its signature not checked (tests read what was minted)."""
    return {"header": jwt.get_unverified_header(token),
            "claims": jwt.decode(token, options={"verify_signature": False})}


@pytest.fixture(scope="session")
def make_service_token(engram_home: Path) -> Callable[[str], str]:
    """The token service ``name`` presents to the others (``engram up`` mints the same)."""
    signer = TokenSigner.load(engram_home / "auth" / "signing.key")

    def issue(name: str) -> str:
        return signer.issue(*service_principal(name))

    return issue


def _postgres_available() -> bool:
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(POSTGRES_ADMIN_URL)
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def postgres_available() -> bool:
    return _postgres_available()


@pytest.fixture
def fresh_postgres_urls(postgres_available: bool) -> Iterator[Callable[[], str]]:
    """``make()``: a new, empty Postgres database each call, all dropped afterwards."""
    require(postgres_available, "PostgreSQL is not reachable on 127.0.0.1:5432")
    import sqlalchemy

    admin = sqlalchemy.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    made: list[str] = []

    def make() -> str:
        name = f"engram_test_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        made.append(name)
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"

    try:
        yield make
    finally:
        with admin.connect() as conn:
            for name in made:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def fresh_postgres_url(fresh_postgres_urls: Callable[[], str]) -> str:
    """A new, empty Postgres database for one test, dropped afterwards."""
    return fresh_postgres_urls()


@pytest.fixture
def moto_endpoint() -> Iterator[str]:
    """An S3 endpoint on a loopback port of its own: moto's server in a thread of this process
    (port 0, so no other test can take the port between choosing and binding it), reset after
    the test. Subprocesses reach it by its address like any S3; clients need credentials of
    any value."""
    import urllib.request

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        yield endpoint
    finally:
        try:  # moto keeps its buckets in this process: the next test starts from none
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset",
                                                          method="POST"), timeout=30).close()
        finally:
            server.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (``make test`` runs ``-n 2 --dist loadgroup``) the fault tests share one
    worker, one after another: each kills, starves or times a whole stack, and its criteria
    assume no second fault test loads the same two cores at once."""
    for item in items:
        if item.get_closest_marker("faults"):
            item.add_marker(pytest.mark.xdist_group("faults"))
