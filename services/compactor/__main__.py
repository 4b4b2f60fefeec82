"""`python -m services.compactor`: serve until SIGTERM/SIGINT (settings: ENGRAM_COMPACTOR_*)."""

from __future__ import annotations

from services.common.startup import run_service
from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings


def main() -> None:
    run_service("compactor", CompactorSettings, build_compactor_server)


if __name__ == "__main__":
    main()
