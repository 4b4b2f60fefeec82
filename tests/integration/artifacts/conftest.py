"""A real artifacts server on 127.0.0.1 port 0, over SQLite or Postgres, file:// blobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engram.client.artifacts import ArtifactsClient
from services.artifacts.server import build_artifacts_server
from services.artifacts.service import ArtifactsService
from services.artifacts.settings import ArtifactsSettings
from services.common.server import EngramServer


@dataclass
class RunningArtifacts:
    server: EngramServer
    service: ArtifactsService
    blob_root: Path
    client_for: Callable[..., ArtifactsClient]

    @property
    def client(self) -> ArtifactsClient:
        return self.client_for()


@contextmanager
def running_artifacts(db_url: str, blob_root: Path, engram_home: Path,
                      make_token: Callable[..., str],
                      **settings: Any) -> Iterator[RunningArtifacts]:
    """A started artifacts server; ``settings`` override ArtifactsSettings fields."""
    server, service = build_artifacts_server(ArtifactsSettings(
        home=engram_home, port=0, db_url=db_url, blob_url=blob_root.as_uri(),
        resolve_retry_delay_seconds=0.01, **settings))
    server.start()
    clients: list[ArtifactsClient] = []

    def client_for(fleet: str = "fleet-a", agent: str = "agent-1") -> ArtifactsClient:
        client = ArtifactsClient(server.address, make_token(agent, fleet), timeout=30)
        clients.append(client)
        return client

    try:
        yield RunningArtifacts(server, service, blob_root, client_for)
    finally:
        for client in clients:
            client.close()
        server.stop(0)


@pytest.fixture(params=["sqlite", "postgres"])
def artifacts_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'artifacts.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def artifacts_server(artifacts_db_url: str, tmp_path: Path, engram_home: Path,
                     make_token: Callable[..., str]) -> Iterator[RunningArtifacts]:
    with running_artifacts(artifacts_db_url, tmp_path / "blobs", engram_home,
                           make_token) as running:
        yield running
