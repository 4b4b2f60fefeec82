"""Run the artifacts service: `python -m services.artifacts` (settings from ENGRAM_ARTIFACTS_*)."""

from __future__ import annotations

from services.artifacts.server import build_artifacts_server
from services.artifacts.settings import ArtifactsSettings
from services.common.server import EngramServer
from services.common.startup import run_service


def build(settings: ArtifactsSettings) -> EngramServer:
    server, _service = build_artifacts_server(settings)
    return server


if __name__ == "__main__":
    run_service("artifacts", ArtifactsSettings, build)
