"""Run the artifacts service: `python -m services.artifacts` (settings from ENGRAM_ARTIFACTS_*)."""

from __future__ import annotations

from services.artifacts.server import build_artifacts_server
from services.artifacts.settings import ArtifactsSettings
from services.common.logging_setup import configure_logging


def main() -> None:
    settings = ArtifactsSettings()
    configure_logging("artifacts", settings.log_level)
    server, _memory = build_artifacts_server(settings)
    server.start()
    server.run_until_signalled()


if __name__ == "__main__":
    main()
