"""``run_service``: the one entry point of every service's ``__main__``.

A service that cannot start (a setting that does not parse, a TLS file missing, a port
taken, a failed migration) says why in one log line naming the setting or the cause and
exits 2, with no traceback; one that starts serves until SIGTERM/SIGINT and drains.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

from pydantic import ValidationError

from services.common.logging_setup import configure_logging
from services.common.memory import limit_arenas
from services.common.settings import ServerSettings
from services.common.tracing import configure_tracing

if TYPE_CHECKING:  # server.py raises StartupError, so it cannot be imported from here at run time
    from services.common.server import EngramServer

log = logging.getLogger("engram.startup")

S = TypeVar("S", bound=ServerSettings)

EXIT_CANNOT_START = 2


class StartupError(Exception):
    """A service cannot start as configured; the message names the setting or the cause."""


def settings_error(settings_type: type[ServerSettings], error: ValidationError) -> str:
    """One line per invalid setting, each named as the environment variable an operator sets."""
    prefix = str(settings_type.model_config.get("env_prefix", "ENGRAM_"))
    parts = []
    for problem in error.errors():
        field = ".".join(str(part) for part in problem["loc"]) or "?"
        name = field if field.startswith("ENGRAM_") else f"{prefix}{field}".upper()
        parts.append(f"{name}: {problem['msg']}")
    return "; ".join(parts)


def _fail(service: str, message: str) -> NoReturn:
    log.error("cannot start %s: %s", service, message, extra={"exit_code": EXIT_CANNOT_START})
    sys.exit(EXIT_CANNOT_START)


def run_service(service: str, settings_type: type[S],
                build: Callable[[S], EngramServer]) -> None:
    """Parse settings, build and start the server, serve until signalled; exit 2 if it cannot."""
    limit_arenas()  # before the server's threads exist
    try:
        settings = settings_type()
    except ValidationError as error:
        configure_logging(service, "INFO")
        _fail(service, settings_error(settings_type, error))
    configure_logging(service, settings.log_level)
    configure_tracing(service)
    try:
        server = build(settings).start()
    except (StartupError, OSError, ValueError, RuntimeError) as error:
        log.debug("start-up failed", exc_info=True)
        _fail(service, str(error) or type(error).__name__)
    except Exception as error:  # a failed migration or store: still one line, exit 2
        log.debug("start-up failed", exc_info=True)
        _fail(service, f"{type(error).__name__}: {error}")
    server.run_until_signalled()
