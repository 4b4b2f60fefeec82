"""A real artifacts server on 127.0.0.1 port 0, over SQLite or Postgres, file:// blobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

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


@pytest.fixture(params=["sqlite", "postgres"])
def artifacts_server(request: pytest.FixtureRequest, tmp_path: Path, engram_home: Path,
                     make_token: Callable[..., str]) -> Iterator[RunningArtifacts]:
    if request.param == "sqlite":
        db_url = f"sqlite:///{tmp_path / 'artifacts.db'}"
    else:
        db_url = request.getfixturevalue("fresh_postgres_url")
    blob_root = tmp_path / "blobs"
    settings = ArtifactsSettings(home=engram_home, port=0, db_url=db_url,
                                 blob_url=blob_root.as_uri(), resolve_retry_delay_seconds=0.01)
    server, service = build_artifacts_server(settings)
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
