"""`python -m services.embedder`: serve until SIGTERM/SIGINT (settings: ENGRAM_EMBEDDER_*)."""

from __future__ import annotations

from services.common.startup import run_service
from services.embedder.server import build_embedder_server
from services.embedder.settings import EmbedderSettings


def main() -> None:
    run_service("embedder", EmbedderSettings, build_embedder_server)


if __name__ == "__main__":
    main()
