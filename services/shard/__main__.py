"""Run the shard service: `python -m services.shard` (settings from ENGRAM_SHARD_*).

Every write passes governance's gate (DESIGN.md section 1): without
ENGRAM_SHARD_GOVERNANCE_ADDR the shard refuses to start, unless
ENGRAM_SHARD_ALLOW_UNGATED=true says this is an isolated test or benchmark.
"""

from __future__ import annotations

import logging
import sys

from services.common.logging_setup import configure_logging
from services.shard.governance_gate import connect_governance
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings

log = logging.getLogger("engram.shard")


def main() -> None:
    settings = ShardSettings()
    configure_logging("shard", settings.log_level)
    gate = trust = None
    if settings.governance_addr:
        if settings.service_token_file is None or not settings.service_token_file.exists():
            log.error("ENGRAM_SHARD_SERVICE_TOKEN_FILE must name a service token for governance")
            sys.exit(2)
        try:
            gate, trust = connect_governance(settings.governance_addr, settings.service_token_file,
                                             tls=settings.governance_tls())
        except (OSError, ValueError) as error:  # a TLS file missing or settings that clash
            log.error("cannot reach governance as configured: %s", error)
            sys.exit(2)
    elif not settings.allow_ungated:
        log.error(
            "no ENGRAM_SHARD_GOVERNANCE_ADDR: every write must pass the governance gate; "
            "set ENGRAM_SHARD_ALLOW_UNGATED=true only for isolated tests"
        )
        sys.exit(2)
    else:
        log.warning("running WITHOUT the governance gate (ENGRAM_SHARD_ALLOW_UNGATED=true)")
    server, _service = build_shard_server(settings, gate=gate, trust=trust)
    server.start()
    log.info("shard ready", extra={"address": server.address, "gated": gate is not None})
    server.run_until_signalled()


if __name__ == "__main__":
    main()
