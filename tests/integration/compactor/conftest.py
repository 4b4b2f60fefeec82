"""A real shard server and a real compactor server on 127.0.0.1:0, talking over gRPC.

The compactor's own store runs on SQLite and on Postgres (the same contract tests); the
shard is the real shard service (SQLite), reached with a service token as in production.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engram.client import EngramRpcError
from engram.client.compactor import CompactorClient
from engram.client.shard import ShardClient
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory, client_factory


@pytest.fixture
def shard_server(engram_home: Path, tmp_path: Path) -> Iterator[EngramServer]:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True)
    server, _service = build_shard_server(settings)
    server.start()
    yield server
    server.stop(0)


@pytest.fixture(params=["sqlite", "postgres"])
def compactor_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'compactor.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def compactor_settings(engram_home: Path, tmp_path: Path, compactor_db_url: str,
                       shard_server: EngramServer, make_token: TokenFactory) -> CompactorSettings:
    token_file = tmp_path / "compactor.token"
    write_token_file(token_file, make_token("svc-compactor", "system", ("service",)))
    return CompactorSettings(
        home=engram_home, port=0, db_url=compactor_db_url,
        blob_url=(tmp_path / "blobs").resolve().as_uri(), shard_addr=shard_server.address,
        service_token_file=token_file, rotate_bytes=2000, snapshot_every=5, keep_snapshots=3,
        hot_size=4)


@pytest.fixture
def compactor_server(compactor_settings: CompactorSettings) -> Iterator[EngramServer]:
    server = build_compactor_server(compactor_settings).start()
    yield server
    server.stop(0)


@pytest.fixture
def target(compactor_settings: CompactorSettings, tmp_path: Path) -> Iterator[EngramServer]:
    """A second compactor, on its own SQLite store and blobs: where an import lands."""
    server = build_compactor_server(compactor_settings.model_copy(update={
        "db_url": f"sqlite:///{tmp_path / 'target.db'}",
        "blob_url": (tmp_path / "target-blobs").resolve().as_uri()})).start()
    yield server
    server.stop(0)


def refused(call: object, *args: object) -> EngramRpcError:
    """The error ``call(*args)`` raises (the test fails if it raises none)."""
    with pytest.raises(EngramRpcError) as failure:
        call(*args)  # type: ignore[operator]
    return failure.value


CompactorFactory = Callable[..., CompactorClient]


@pytest.fixture
def compactor_for(compactor_server: EngramServer,
                  make_token: TokenFactory) -> Iterator[CompactorFactory]:
    with client_factory(lambda token: CompactorClient(compactor_server.address, token),
                        make_token) as connect:
        yield connect


@pytest.fixture
def shard_for(shard_server: EngramServer,
              make_token: TokenFactory) -> Iterator[Callable[..., ShardClient]]:
    with client_factory(lambda token: ShardClient(shard_server.address, token),
                        make_token) as connect:
        yield connect
