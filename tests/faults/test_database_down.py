"""The shard's database goes away and comes back (item 9 of issue 16).

The shard runs on its own Postgres database (governance on SQLite). While it serves, the
database stops accepting connections and every session on it is terminated (what a failover
or a stopped server looks like to a client; the shared server itself keeps running). Later it
accepts connections again.

Criterion: readiness goes NOT_SERVING while the database is away (within a few probe
intervals); every write in that time fails UNAVAILABLE (never INTERNAL, never OK); once the
database is back, health returns to SERVING and writes succeed on the same process (no
restart), and every record acknowledged before the outage is still there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy

from engram.client import EngramRpcError, ShardClient
from tests.conftest import POSTGRES_ADMIN_URL
from tests.faults.conftest import Stack, health, scale

pytestmark = [pytest.mark.faults]


@pytest.fixture
def admin() -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def _allow(admin: sqlalchemy.Engine, database: str, allowed: bool) -> None:
    with admin.connect() as connection:
        connection.exec_driver_sql(
            f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            connection.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,))


def _wait_for(address: str, status: int, seconds: float = 15.0) -> float:
    began = time.monotonic()
    while health(address) != status:
        assert time.monotonic() - began < seconds, f"health never became {status}"
        time.sleep(0.1)
    return time.monotonic() - began


def test_database_away_is_not_serving_and_unavailable_then_recovers(
    stack: Stack, fresh_postgres_url: str, admin: sqlalchemy.Engine
) -> None:
    database = fresh_postgres_url.rsplit("/", 1)[1]
    stack.extra["shard"] = {"ENGRAM_SHARD_DB_URL": fresh_postgres_url}
    stack.start("governance")
    stack.start("shard")
    pid = stack.popen("shard").pid
    address = stack.address("shard")
    with ShardClient(address, stack.token("agent-db"), timeout=10) as shard:
        kept = [shard.add(f"fact {i} before the outage").record.id for i in range(3)]
        for cycle in range(scale(1, 5)):
            _allow(admin, database, False)
            try:
                down_after = _wait_for(address, 2)
                for attempt in range(3):
                    with pytest.raises(EngramRpcError) as refused:
                        shard.add(f"fact during outage {cycle}.{attempt}")
                    assert refused.value.code.name == "UNAVAILABLE", refused.value
            finally:
                _allow(admin, database, True)
            up_after = _wait_for(address, 1)
            kept.append(shard.add(f"fact {cycle} after the outage").record.id)
            print(f"cycle {cycle}: NOT_SERVING {down_after:.2f} s after the database went "
                  f"away, SERVING {up_after:.2f} s after it came back")
        for record_id in kept:
            assert shard.get(record_id).id == record_id
    assert stack.popen("shard").pid == pid and stack.popen("shard").poll() is None
