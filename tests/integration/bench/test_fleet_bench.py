"""`engram bench fleet` end to end: a short run against the four services it starts itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engram.bench.fleet import OPERATIONS, START_RUN, _postgres_databases
from engram.cli.main import app
from tests.conftest import POSTGRES_ADMIN_URL, require

pytestmark = pytest.mark.timeout(240)


def test_a_short_fleet_run_exercises_every_operation_and_reports_the_figures(
    tmp_path: Path,
) -> None:
    out = tmp_path / "fleet.json"
    result = CliRunner().invoke(app, ["bench", "fleet", "--agents", "4", "--duration", "3",
                                      "--fleets", "2", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert json.loads(result.stdout) == figures
    assert figures["agents"] == 4 and figures["fleets"] == 2 and figures["duration_s"] == 3.0
    assert figures["stack"] == "started stack on sqlite"
    assert set(figures["ratios"]) == set(OPERATIONS)
    assert 3.0 <= figures["elapsed_s"] < 3.0 + 30  # stops by itself (a last call may be slow)
    assert figures["ops_per_s"] > 0 and figures["ops"] > 0
    assert isinstance(figures["errors"], dict)
    assert figures["echo"]["p50_ms"] > 0 and figures["echo"]["calls_per_s"] > 0
    for operation in (*OPERATIONS, START_RUN):
        assert figures["operations"][operation]["ok"] >= 1, operation
        assert set(figures["latency_ms"][operation]) == {"p50", "p95", "p99"}
        latency = figures["latency_ms"][operation]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
    # The agents' own checks held: every acknowledged write was in its run's snapshot.
    assert "SNAPSHOT_SHORT" not in figures["errors"]


@pytest.mark.postgres
def test_postgres_databases_are_fresh_per_service_and_dropped_afterwards(
    postgres_available: bool,
) -> None:
    require(postgres_available, "PostgreSQL is not reachable on 127.0.0.1:5432")
    import sqlalchemy

    with _postgres_databases(POSTGRES_ADMIN_URL, ("shard", "governance")) as urls:
        names = {sqlalchemy.engine.make_url(url).database for url in urls.values()}
        assert len(names) == 2
        engine = sqlalchemy.create_engine(urls["shard"])
        with engine.connect() as conn:
            assert conn.exec_driver_sql("select 1").scalar() == 1
        engine.dispose()
    admin = sqlalchemy.create_engine(POSTGRES_ADMIN_URL)
    with admin.connect() as conn:
        left = conn.exec_driver_sql("select datname from pg_database").scalars().all()
    admin.dispose()
    assert not names & set(left)
