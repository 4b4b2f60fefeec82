"""Assemble the shard server: store, gate, trust, servicer, shared runtime."""

from __future__ import annotations

from pathlib import Path

from services.common.db import Database
from services.common.server import EngramServer, ServiceSpec, build_server
from services.shard.compaction import MemoryCompactor
from services.shard.ports import TrustSource, WriteGate
from services.shard.service import ShardService
from services.shard.servicer import POLICY, SERVICE_NAME, ShardServicer, add_to_server
from services.shard.settings import ShardSettings

MIGRATIONS = Path(__file__).parent / "migrations"


def build_shard_server(
    settings: ShardSettings,
    *,
    gate: WriteGate | None = None,
    trust: TrustSource | None = None,
    database: Database | None = None,
) -> tuple[EngramServer, ShardService]:
    database = database or Database(settings.database_url())
    if settings.migrate:
        database.upgrade(MIGRATIONS)
    service = ShardService(database, gate=gate, trust=trust)
    servicer = ShardServicer(service, MemoryCompactor(service))
    spec = ServiceSpec(
        name="shard",
        full_names=[SERVICE_NAME],
        register=lambda server: add_to_server(servicer, server),
        policy=POLICY,
        on_stop=database.dispose,
    )
    return build_server(settings, spec), service
