"""Assemble the governance server: store, migrations, chain check at start, servicer, runtime."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from services.common.access import AccessRestrictions
from services.common.db import Database
from services.common.pagination import PageTokens
from services.common.server import EngramServer, ServiceSpec, build_server
from services.governance.metrics import GovernanceMetrics
from services.governance.service import GovernanceService
from services.governance.servicer import (
    KINDS,
    POLICY,
    SERVICE_NAME,
    SUSPENDED_MAY_CALL,
    GovernanceServicer,
    add_to_server,
)
from services.governance.settings import GovernanceSettings

MIGRATIONS = Path(__file__).parent / "migrations"

log = logging.getLogger("engram.governance")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def build_governance_server(settings: GovernanceSettings) -> EngramServer:
    database = Database(settings.database_url(), **settings.database_options())
    database.prepare_schema(MIGRATIONS, "governance", migrate=settings.migrate)
    service = GovernanceService(database, _now_ms,
                                erasure_bytes_per_day=settings.erasure_bytes_per_day)
    checkpoint, problems = service.verify_at_start()
    if problems:
        log.error(
            "WITNESS CHAIN BROKEN: governance state does not match its chain; refusing to "
            "serve writes and reporting NOT_SERVING until it is restored",
            extra={"problems": problems[:20], "problem_count": len(problems),
                   "chain_length": checkpoint.length},
        )
    else:
        log.info("witness chain verified from the last verified checkpoint",
                 extra={"chain_length": checkpoint.length, "head": checkpoint.head})
    # Governance enforces revocations and suspensions from its own store, polled like the
    # other services poll it (so every replica sees the others' changes within the interval).
    restrictions = AccessRestrictions(service.access_restrictions,
                                      refresh_seconds=settings.auth_restrictions_refresh_seconds,
                                      suspended_may_call=SUSPENDED_MAY_CALL,
                                      origin="the governance store")
    servicer = GovernanceServicer(service, pages=PageTokens.for_service(settings, "governance"),
                                  limits=settings.limits, restrictions=restrictions)
    def stop() -> None:
        service.stop_full_verification()  # before the store closes under it
        database.dispose()

    spec = ServiceSpec(
        name="governance",
        full_names=[SERVICE_NAME],
        register=lambda server: add_to_server(servicer, server),
        policy=POLICY,
        kinds=KINDS,
        on_start=lambda: service.start_full_verification(
            on_broken=lambda _problems: server.set_serving(False)),
        on_stop=stop,
        ready=lambda: service.chain_intact,
        restrictions=restrictions,
        probe=lambda: service.chain_intact and database.ping(),
    )
    spec.registry.register(GovernanceMetrics(service))
    server = build_server(settings, spec)
    return server
