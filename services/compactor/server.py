"""Assemble the compactor server: store, tier repair, shard gateway, schedule, servicer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.common.access import governance_restrictions
from services.common.blobstore import blob_store_from_url
from services.common.db import Database
from services.common.erasure_source import governance_erasures
from services.common.metrics import counter
from services.common.pagination import PageTokens
from services.common.server import EngramServer, ServiceSpec, build_server
from services.common.startup import StartupError
from services.compactor.domain.repairs import RepairBackoff
from services.compactor.erasure import IterationEraser
from services.compactor.repository import CompactorRepository
from services.compactor.scheduler import CompactionSchedule, TierRepairLoop
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


class CompactorMetrics(Collector):
    """Compaction and tiering work on /metrics (read at scrape time)."""

    def __init__(self, log: IterationLog, policies: MemoryPolicyRunner) -> None:
        self._log = log
        self._policies = policies

    def collect(self) -> Iterator[Metric]:
        yield counter("engram_compactor_policy_runs",
                      "Memory compaction and retention runs, by kind and outcome.",
                      ["kind", "outcome"], self._policies.runs_done)
        yield counter("engram_compactor_policy_records",
                      "Records compacted into summaries or removed by retention (not dry runs).",
                      ["action"], self._policies.records)
        sealed = dict(self._log.sealed.items())
        yield CounterMetricFamily("engram_compactor_sealed_segments",
                                  "Warm-log segments sealed into the blob store.",
                                  value=sealed.get(("segments",), 0.0))
        yield CounterMetricFamily("engram_compactor_sealed_bytes",
                                  "Bytes of the warm-log segments sealed into the blob store.",
                                  value=sealed.get(("bytes",), 0.0))
        yield counter("engram_integrity_failures",
                      "Problems found by VerifyRun in the warm and cold tiers.", ["reason"],
                      self._log.integrity_failures)


class TierRepairMetrics(Collector):
    """The repair loop's state on /metrics: runs failing now, and failures since start."""

    def __init__(self, repairs: RepairBackoff) -> None:
        self._repairs = repairs

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "engram_compactor_tier_repair_failing_runs",
            "Runs whose last attempt at their pending tier work (seal, snapshot) failed.",
            value=self._repairs.failing())
        yield CounterMetricFamily(
            "engram_compactor_tier_repair_failures",
            "Failed attempts at a run's pending tier work since start.",
            value=self._repairs.total_failures)


def _repair_backoff(settings: CompactorSettings) -> RepairBackoff:
    if settings.tier_repair_backoff_max_seconds < settings.tier_repair_backoff_seconds:
        raise StartupError(
            "ENGRAM_COMPACTOR_TIER_REPAIR_BACKOFF_MAX_SECONDS must be at least "
            "ENGRAM_COMPACTOR_TIER_REPAIR_BACKOFF_SECONDS")
    return RepairBackoff(settings.tier_repair_backoff_seconds,
                         settings.tier_repair_backoff_max_seconds)


def build_compactor_server(settings: CompactorSettings) -> EngramServer:
    repairs = _repair_backoff(settings)
    database = Database(settings.database_url(), **settings.database_options())
    try:
        return _build(settings, database, repairs)
    except BaseException:
        database.dispose()  # a failed start leaves no connection open behind it
        raise


def _build(settings: CompactorSettings, database: Database,
           repairs: RepairBackoff) -> EngramServer:
    database.prepare_schema(MIGRATIONS, "compactor", migrate=settings.migrate)
    blobs = blob_store_from_url(settings.blob_store_url(), **settings.blob_store_options())
    repository = CompactorRepository(database)
    # Interrupted tier work is finished in the background: one failing run delays no start.
    iteration_log = IterationLog(repository, blobs, settings.tier_config(), repairs=repairs,
                                 limits=settings.limits)
    repair_loop = TierRepairLoop(iteration_log, settings.tier_repair_interval_seconds)
    gateway = ShardCompactionGateway(settings.shard_addr, _service_token(settings),
                                     settings.shard_timeout_seconds, settings.shard_tls())
    policies = MemoryPolicyRunner(gateway, repository)
    schedule = CompactionSchedule(policies, settings.scheduled_fleets(),
                                  settings.memory_compaction_interval_seconds,
                                  settings.memory_importance_below,
                                  settings.memory_older_than_days)
    erasures = governance_erasures(settings.governance_addr, _service_token_file(settings),
                                   settings.governance_tls())
    servicer = CompactorServicer(iteration_log, policies,
                                 PageTokens.for_service(settings, "compactor"),
                                 IterationEraser(iteration_log, database, blobs, erasures))
    restrictions = governance_restrictions(
        "compactor", settings.governance_addr, _service_token_file(settings),
        settings.governance_tls(), settings.auth_restrictions_refresh_seconds)

    def start() -> None:
        repair_loop.start()
        schedule.start()

    def stop() -> None:
        schedule.stop()
        repair_loop.stop()
        gateway.close()
        if erasures is not None:
            erasures.close()
        database.dispose()

    spec = ServiceSpec(
        name="compactor",
        full_names=[SERVICE_NAME],
        register=lambda server: add_to_server(servicer, server),
        policy=POLICY,
        kinds=KINDS,
        on_start=start,
        on_stop=stop,
        restrictions=restrictions,
        probe=database.ping,
    )
    spec.registry.register(TierRepairMetrics(repairs))
    spec.registry.register(CompactorMetrics(iteration_log, policies))
    return build_server(settings, spec)
