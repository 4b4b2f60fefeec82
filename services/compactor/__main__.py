"""`python -m services.compactor`: serve until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import sys

from services.common.logging_setup import configure_logging
from services.common.server import build_server
from services.compactor.service import service_spec
from services.compactor.settings import CompactorSettings

log = logging.getLogger("engram.compactor")


def main() -> None:
    settings = CompactorSettings()
    configure_logging("compactor", settings.log_level)
    try:
        spec = service_spec(settings)
    except (OSError, ValueError) as error:  # e.g. a TLS file missing, or a cert without its key
        log.error("cannot start the compactor as configured: %s", error)
        sys.exit(2)
    server = build_server(settings, spec).start()
    server.run_until_signalled()


if __name__ == "__main__":
    main()
