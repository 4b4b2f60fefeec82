"""`python -m services.compactor`: serve until SIGTERM/SIGINT."""

from __future__ import annotations

from services.common.logging_setup import configure_logging
from services.common.server import build_server
from services.compactor.service import service_spec
from services.compactor.settings import CompactorSettings


def main() -> None:
    settings = CompactorSettings()
    configure_logging("compactor", settings.log_level)
    server = build_server(settings, service_spec(settings)).start()
    server.run_until_signalled()


if __name__ == "__main__":
    main()
