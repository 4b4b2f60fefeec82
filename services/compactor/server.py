"""Assemble the compactor server: store, tier recovery, shard gateway, schedule, servicer."""

from __future__ import annotations

import logging
from pathlib import Path

from services.common.access import governance_restrictions
from services.common.blobstore import blob_store_from_url
from services.common.db import Database
from services.common.server import EngramServer, ServiceSpec, build_server
from services.common.startup import StartupError
from services.compactor.repository import CompactorRepository
from services.compactor.scheduler import CompactionSchedule
from services.compactor.service import IterationLog, MemoryPolicyRunner
from services.compactor.servicer import (
    KINDS,
    POLICY,
    SERVICE_NAME,
    CompactorServicer,
    add_to_server,
)
from services.compactor.settings import CompactorSettings
from services.compactor.shard_gateway import ShardCompactionGateway

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
log = logging.getLogger("engram.compactor")


def _service_token_file(settings: CompactorSettings) -> Path:
    return settings.service_token_file or settings.home / "auth" / "compactor.token"


def _service_token(settings: CompactorSettings) -> str:
    path = _service_token_file(settings)
    if not path.exists():
        raise StartupError(
            f"no service token at {path}: set ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE to a token "
            "with role 'service' (`engram up` writes one)")
    return path.read_text().strip()


def build_compactor_server(settings: CompactorSettings) -> EngramServer:
    database = Database(settings.database_url())
    try:
        return _build(settings, database)
    except BaseException:
        database.dispose()  # a failed start leaves no connection open behind it
        raise


def _build(settings: CompactorSettings, database: Database) -> EngramServer:
    if settings.migrate:
        database.upgrade(MIGRATIONS)
    blobs = blob_store_from_url(settings.blob_store_url(),
                                endpoint_url=settings.blob_endpoint_url,
                                region_name=settings.blob_region)
    repository = CompactorRepository(database)
    iteration_log = IterationLog(repository, blobs, settings.tier_config())
    recovered = iteration_log.recover()
    if recovered:
        log.info("finished interrupted tier work", extra={"runs": recovered})
    gateway = ShardCompactionGateway(settings.shard_addr, _service_token(settings),
                                     settings.shard_timeout_seconds, settings.shard_tls())
    policies = MemoryPolicyRunner(gateway, repository)
    schedule = CompactionSchedule(policies, settings.scheduled_fleets(),
                                  settings.memory_compaction_interval_seconds,
                                  settings.memory_importance_below,
                                  settings.memory_older_than_days)
    servicer = CompactorServicer(iteration_log, policies)
    restrictions = governance_restrictions(
        "compactor", settings.governance_addr, _service_token_file(settings),
        settings.governance_tls(), settings.auth_restrictions_refresh_seconds)

    def stop() -> None:
        schedule.stop()
        gateway.close()
        database.dispose()

    spec = ServiceSpec(
        name="compactor",
        full_names=[SERVICE_NAME],
        register=lambda server: add_to_server(servicer, server),
        policy=POLICY,
        kinds=KINDS,
        on_start=schedule.start,
        on_stop=stop,
        restrictions=restrictions,
    )
    return build_server(settings, spec)
