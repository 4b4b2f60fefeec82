"""The compactor's wiring: migrations only when asked, the schedule only while serving."""

from __future__ import annotations

import threading

import sqlalchemy

from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings


def _schedule_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "compaction-schedule"]


def test_without_migrate_the_schema_is_left_alone(compactor_settings: CompactorSettings) -> None:
    settings = compactor_settings.model_copy(update={"migrate": False})
    server = build_compactor_server(settings)
    engine = sqlalchemy.create_engine(settings.database_url())
    try:
        assert sqlalchemy.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
        server.stop(0)


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
