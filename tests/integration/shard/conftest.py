"""A real shard server on 127.0.0.1:0, once per backend (SQLite file, Postgres)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engram.client import ShardClient
from services.shard.server import build_shard_server
from services.shard.service import ShardService
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory, client_factory


@pytest.fixture(params=["sqlite", "postgres"])
def shard_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shard.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def shard(shard_db_url: str, engram_home: Path) -> Iterator[tuple[str, ShardService]]:
    settings = ShardSettings(home=engram_home, db_url=shard_db_url, port=0, allow_ungated=True)
    server, service = build_shard_server(settings)
    server.start()
    try:
        yield server.address, service
    finally:
        server.stop(0)


ClientFactory = Callable[..., ShardClient]


@pytest.fixture
def client_for(
    shard: tuple[str, ShardService], make_token: TokenFactory
) -> Iterator[ClientFactory]:
    with client_factory(lambda token: ShardClient(shard[0], token), make_token) as connect:
        yield connect


@pytest.fixture
def client(client_for: ClientFactory) -> ShardClient:
    return client_for()
