"""Assemble the artifacts server: database + migrations, blob store, service, servicer, runtime."""

from __future__ import annotations

import logging
from pathlib import Path

from services.artifacts.erasure import RunEraser
from services.artifacts.metrics import ArtifactsMetrics
from services.artifacts.service import ArtifactsService
from services.artifacts.servicer import (
    KINDS,
    POLICY,
    SERVICE_NAME,
    ArtifactsServicer,
    add_to_server,
)
from services.artifacts.settings import ArtifactsSettings
from services.common.access import governance_restrictions
from services.common.blobstore import blob_store_from_url
from services.common.db import Database
from services.common.erasure_source import governance_erasures
from services.common.pagination import PageTokens
from services.common.server import EngramServer, ServiceSpec, build_server

log = logging.getLogger("engram.artifacts")
MIGRATIONS = Path(__file__).parent / "migrations"


def build_artifacts_server(settings: ArtifactsSettings) -> tuple[EngramServer, ArtifactsService]:
    """The server (not started) and the service behind it, for tests to reach the stores."""
    database = Database(settings.database_url(), **settings.database_options())
    database.prepare_schema(MIGRATIONS, "artifacts", migrate=settings.migrate)
    blobs = blob_store_from_url(settings.blob_store_url(), **settings.blob_store_options())
    service = ArtifactsService(database, blobs, retry_delay_s=settings.resolve_retry_delay_seconds,
                               limits=settings.artifact_limits(),
                               pages=PageTokens.for_service(settings, "artifacts"))
    log.info("artifacts store ready", extra={"blob_store": blobs.url,
                                             "database": database.dialect})
    erasures = governance_erasures(settings.governance_addr, settings.service_token_file,
                                   settings.governance_tls())
    servicer = ArtifactsServicer(service, RunEraser(service, erasures))
    restrictions = governance_restrictions(
        "artifacts", settings.governance_addr, settings.service_token_file,
        settings.governance_tls(), settings.auth_restrictions_refresh_seconds)

    def stop() -> None:
        if erasures is not None:
            erasures.close()
        blobs.close()
        database.dispose()

    spec = ServiceSpec(
        name="artifacts",
        full_names=[SERVICE_NAME],
        register=lambda server: add_to_server(servicer, server),
        policy=POLICY,
        kinds=KINDS,
        on_stop=stop,
        restrictions=restrictions,
        probe=database.ping,
    )
    spec.registry.register(ArtifactsMetrics(service))
    return build_server(settings, spec), service
