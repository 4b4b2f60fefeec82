"""Run the shard service: `python -m services.shard` (settings from ENGRAM_SHARD_*).

Every write passes governance's gate (DESIGN.md section 1): without
ENGRAM_SHARD_GOVERNANCE_ADDR the shard refuses to start, unless
ENGRAM_SHARD_ALLOW_UNGATED=true says this is an isolated test or benchmark.
"""

from __future__ import annotations

import logging

from services.common.server import EngramServer
from services.common.startup import StartupError, run_service
from services.shard.governance_gate import GovernanceGate, GovernanceTrust, connect_governance
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings

log = logging.getLogger("engram.shard")


def governance(settings: ShardSettings) -> tuple[GovernanceGate | None, GovernanceTrust | None]:
    """The gate and trust adapters the settings name; none only for an ungated shard."""
    if settings.governance_addr:
        if settings.service_token_file is None or not settings.service_token_file.exists():
            raise StartupError(
                "ENGRAM_SHARD_SERVICE_TOKEN_FILE must name a service token for governance")
        try:
            return connect_governance(settings.governance_addr, settings.service_token_file,
                                      tls=settings.governance_tls(),
                                      max_candidates=settings.limits.batch_items)
        except (OSError, ValueError) as error:  # a TLS file missing or settings that clash
            raise StartupError(f"cannot reach governance as configured: {error}") from error
    if not settings.allow_ungated:
        raise StartupError(
            "no ENGRAM_SHARD_GOVERNANCE_ADDR: every write must pass the governance gate; "
            "set ENGRAM_SHARD_ALLOW_UNGATED=true only for isolated tests")
    log.warning("running WITHOUT the governance gate (ENGRAM_SHARD_ALLOW_UNGATED=true)")
    return None, None


def build(settings: ShardSettings) -> EngramServer:
    gate, trust = governance(settings)
    server, _service = build_shard_server(settings, gate=gate, trust=trust)
    return server


if __name__ == "__main__":
    run_service("shard", ShardSettings, build)
