"""Assembles the compactor from its settings: store, blob store, shard gateway, servicer."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from engram.compactor.v1 import compactor_service_pb2_grpc as pb_grpc
from services.common.blobstore import BlobStore, blob_store_from_url
from services.common.db import Database
from services.common.server import ServiceSpec
from services.compactor.iteration_log import IterationLog
from services.compactor.memory_policy import MemoryCompactionPort, MemoryPolicyRunner
from services.compactor.repository import IterationRepository
from services.compactor.scheduler import CompactionSchedule
from services.compactor.servicer import POLICY, SERVICE_NAME, CompactorServicer
from services.compactor.settings import CompactorSettings
from services.compactor.shard_gateway import ShardCompactionGateway

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
log = logging.getLogger("engram.compactor")


@dataclass
class CompactorParts:
    database: Database
    blobs: BlobStore
    log: IterationLog
    policies: MemoryPolicyRunner
    schedule: CompactionSchedule
    closers: list[object] = field(default_factory=list)


def _service_token(settings: CompactorSettings) -> str:
    path = settings.service_token_file or settings.home / "auth" / "compactor.token"
    if not path.exists():
        raise FileNotFoundError(
            f"no service token at {path}: set ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE to a token "
            "with role 'service' (`engram up` writes one)")
    return path.read_text().strip()


def build_parts(settings: CompactorSettings,
                memory_port: MemoryCompactionPort | None = None) -> CompactorParts:
    database = Database(settings.database_url())
    database.upgrade(MIGRATIONS)
    blobs = blob_store_from_url(settings.blob_store_url(),
                                endpoint_url=settings.blob_endpoint_url,
                                region_name=settings.blob_region)
    repository = IterationRepository(database)
    iteration_log = IterationLog(repository, blobs, settings.tier_config())
    recovered = iteration_log.recover()
    if recovered:
        log.info("finished interrupted tier work", extra={"runs": recovered})
    closers: list[object] = []
    if memory_port is None:
        gateway = ShardCompactionGateway(settings.shard_addr, _service_token(settings),
                                         settings.shard_timeout_seconds, settings.shard_tls())
        closers.append(gateway)
        memory_port = gateway
    policies = MemoryPolicyRunner(memory_port, repository)
    schedule = CompactionSchedule(policies, settings.scheduled_fleets(),
                                  settings.memory_compaction_interval_seconds,
                                  settings.memory_importance_below,
                                  settings.memory_older_than_days)
    return CompactorParts(database, blobs, iteration_log, policies, schedule, closers)


def service_spec(settings: CompactorSettings,
                 memory_port: MemoryCompactionPort | None = None) -> ServiceSpec:
    parts = build_parts(settings, memory_port)
    servicer = CompactorServicer(parts.log, parts.policies, parts.log.repo)

    def register(server: grpc.Server) -> None:
        pb_grpc.add_CompactorServiceServicer_to_server(
            servicer, server)
        parts.schedule.start()

    def on_stop() -> None:
        parts.schedule.stop()
        for closer in parts.closers:
            if isinstance(closer, ShardCompactionGateway):
                closer.close()
        parts.database.dispose()

    return ServiceSpec(name="compactor", full_names=[SERVICE_NAME], register=register,
                       policy=POLICY, on_stop=on_stop)
