"""Time one ListRecords page (ShardRepository.page, in process) under hostile and usual filters.

    .venv/bin/python tools/list_filter_bench.py sqlite 50000
    .venv/bin/python tools/list_filter_bench.py postgres 5000

Every record carries the same 31 tags (one in 1,000 also a rare one); the hostile filter names
the 31 and a metadata pair none has. The store is made once (/tmp/list-filter-bench-N.db, or
the Postgres database list_filter_bench_N at 127.0.0.1:5432, user postgres) and reused.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path

import sqlalchemy

from services.common.db import Database
from services.shard.domain.records import Record
from services.shard.repository import RecordFilter, ShardRepository
from services.shard.server import MIGRATIONS

TAGS = tuple(f"t{i:02d}" for i in range(31))
ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _record(i: int) -> Record:
    return Record(id=uuid.uuid4().hex, fleet_id="fleet-a", run_id=f"run-{i % 50}",
                  agent_id=f"a{i % 7}", content=f"note {i} about things", content_hash="h",
                  record_hash="rh", domain="", source="", importance=0.5,
                  tags=TAGS + ((f"rare{i}",) if i % 1000 == 0 else ()),
                  metadata={"k": str(i % 10)}, cross_refs=(), created_us=1_000_000 + i)


def _store(backend: str, n: int) -> tuple[str, bool]:
    if backend == "sqlite":
        path = Path(f"/tmp/list-filter-bench-{n}.db")
        return f"sqlite:///{path}", not path.exists()
    name = f"list_filter_bench_{n}"
    admin = sqlalchemy.create_engine(ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        fresh = not conn.exec_driver_sql(
            "SELECT 1 FROM pg_database WHERE datname = %s", (name,)).first()
        if fresh:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", fresh


def main(backend: str, n: int) -> None:
    url, fresh = _store(backend, n)
    db = Database(url)
    repo = ShardRepository(db.engine.dialect.name)
    if fresh:
        db.upgrade(MIGRATIONS)
        for start in range(0, n, 1000):
            with db.session() as session:
                repo.insert(session, [_record(i) for i in range(start, min(n, start + 1000))])
        if backend != "sqlite":
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
    cases = {
        "31 tags + absent metadata": RecordFilter("fleet-a", tags=TAGS,
                                                  metadata=(("k", "none"),)),
        "absent metadata": RecordFilter("fleet-a", metadata=(("k", "none"),)),
        "1 rare tag": RecordFilter("fleet-a", tags=("rare0", "t01")),
        "unfiltered": RecordFilter("fleet-a"),
        "run": RecordFilter("fleet-a", run_id="run-3"),
    }
    for name, flt in cases.items():
        times = []
        for _ in range(7):
            began = time.perf_counter()
            with db.session() as session:
                page = repo.page(session, flt, None, 51)
            times.append((time.perf_counter() - began) * 1000)
        print(f"{backend} n={n} {name}: median {statistics.median(times):.1f} ms, "
              f"{len(page.rows)} rows, resume_before {page.resume_before}")
    db.engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
