"""A compactor starts and serves even when one run's tier work keeps failing: the failure is
logged, shown (VerifyRun, /metrics) and retried with backoff until it succeeds; other runs'
work is finished meanwhile. Before, start-up redid every run's work in line and the first
failure (a run id '..', a blob store error) stopped the service from starting, for good."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from engram.client.compactor import CompactorClient
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.compactor.repository import CompactorRepository
from services.compactor.server import MIGRATIONS, build_compactor_server
from services.compactor.service import IterationLog
from services.compactor.settings import CompactorSettings
from tests.conftest import TokenFactory
from tests.integration.compactor.test_compactor_contract import iteration
from tests.unit.compactor.support import make_iteration

FLEET = "fleet-a"


class _Interrupted(Exception):
    pass


def _interrupt(step: str) -> None:
    raise _Interrupted(step)


def _leave_pending_work(settings: CompactorSettings, runs: list[str]) -> None:
    """Record 6 iterations of each run while every blob step fails, as a crash would leave
    them: committed, with a snapshot and a seal still to do."""
    database = Database(settings.database_url())
    database.upgrade(MIGRATIONS)
    try:
        log = IterationLog(CompactorRepository(database),
                           FileBlobStore(Path(settings.blob_store_url().removeprefix("file://"))),
                           settings.tier_config(),
                           hook=_interrupt)
        for run_id in runs:
            for n in range(1, 7):
                log.record(FLEET, run_id, make_iteration(n, size=600))
        assert sorted(log.repo.runs_with_pending_work()) == sorted((FLEET, r) for r in runs)
    finally:
        database.dispose()


def _eventually(check: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.1)


def test_a_run_whose_tier_work_keeps_failing_blocks_neither_start_nor_others(
        compactor_settings: CompactorSettings, make_token: TokenFactory) -> None:
    settings = compactor_settings.model_copy(update={
        "tier_repair_interval_seconds": 0.1, "tier_repair_backoff_seconds": 0.2,
        "tier_repair_backoff_max_seconds": 0.5})
    _leave_pending_work(settings, ["good", "bad", ".."])
    blobs = Path(settings.blob_store_url().removeprefix("file://"))
    # 'bad': a file where its blob directory goes, so every put of its work fails.
    shutil.rmtree(blobs / FLEET / "bad", ignore_errors=True)
    (blobs / FLEET).mkdir(parents=True, exist_ok=True)
    (blobs / FLEET / "bad").write_text("in the way")

    server = build_compactor_server(settings).start()
    try:
        client = CompactorClient(server.address, make_token("agent-1", FLEET))
        registry = server.spec.registry
        with client:
            _eventually(lambda: client.verify("good").snapshots_checked == 1)
            assert client.verify("good").ok
            assert client.record("good", iteration(7)).created
            assert client.reconstruct("good", 6).summary.iteration == 6

            _eventually(lambda: (registry.get_sample_value(
                "engram_compactor_tier_repair_failures_total") or 0) >= 4)
            assert registry.get_sample_value("engram_compactor_tier_repair_failing_runs") == 2
            report = client.verify("bad")
            assert not report.ok
            (problem,) = [p for p in report.problems if p.location == "tier work"]
            assert "retried with backoff" in problem.detail

            (blobs / FLEET / "bad").unlink()
            _eventually(lambda: client.verify("bad").ok)  # the failure is forgotten at the end
            assert client.verify("bad").snapshots_checked == 1
            assert registry.get_sample_value("engram_compactor_tier_repair_failing_runs") == 1
            assert client.reconstruct("bad", 5).summary.iteration == 5
    finally:
        server.stop(0)

