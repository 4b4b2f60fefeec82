"""The compactor's wiring: migrations only when asked, the schedule only while serving."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy

from services.common.startup import StartupError
from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings


def _schedule_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "compaction-schedule"]


def test_without_migrate_the_schema_is_left_alone(compactor_settings: CompactorSettings) -> None:
    """Nothing is created, and the start says why it cannot go on (since 2026-11-29: before,
    the server was built on the empty database and its first query failed)."""
    settings = compactor_settings.model_copy(update={"migrate": False})
    with pytest.raises(StartupError, match="ENGRAM_COMPACTOR_MIGRATE=false"):
        build_compactor_server(settings)
    engine = sqlalchemy.create_engine(settings.database_url())
    try:
        assert sqlalchemy.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_the_schedule_starts_with_the_server_not_when_built(
        compactor_settings: CompactorSettings) -> None:
    settings = compactor_settings.model_copy(update={
        "memory_compaction_interval_seconds": 3600.0, "memory_compaction_fleets": "fleet-a"})
    before = len(_schedule_threads())
    server = build_compactor_server(settings)
    try:
        assert len(_schedule_threads()) == before
        server.start()
        assert len(_schedule_threads()) == before + 1
    finally:
        server.stop(0)
    assert len(_schedule_threads()) == before
