"""The same run erasure carried out twice at once (a retry after a deadline beside the first
call, `engram forget --resume` beside `import-bundle`) on Postgres: one call
erases, the other erases nothing; neither fails. Both calls are held together just past
their "already erased?" check. An imported erasure of a run never held leaves one tombstone;
one recorded here leaves none (a governor cannot take a future run id away).

Found in review: on Postgres the second call's tombstone insert hit the first's
(UniqueViolation, INTERNAL); checked failing without insert_once."""

from __future__ import annotations

import contextlib
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from services.artifacts import item_erasure
from services.artifacts.domain.chain import run_leaf
from services.artifacts.erasure import RunEraser
from services.artifacts.server import MIGRATIONS
from services.artifacts.service import ArtifactsService
from services.artifacts.tables import RunTombstoneRow
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.common.erasure_source import ErasureOrder


@pytest.fixture
def service(fresh_postgres_url: str, tmp_path: Path) -> Any:
    """Postgres: on SQLite the carry-outs already take turns (the write lock)."""
    database = Database(fresh_postgres_url)
    database.upgrade(MIGRATIONS)
    yield ArtifactsService(database, FileBlobStore(tmp_path / "blobs"))
    database.engine.dispose()


def _twice_at_once(service: ArtifactsService, order: ErasureOrder,
                   monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    class Source:
        def erasure(self, erasure_id: str) -> ErasureOrder:
            return order

    eraser = RunEraser(service, Source())
    together = threading.Barrier(2)
    erase_run = RunEraser._erase_run

    def held(self: RunEraser, *args: Any) -> Any:
        # Both past the check for a tombstone (on Postgres both get there).
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait(2)
        return erase_run(self, *args)

    monkeypatch.setattr(RunEraser, "_erase_run", held)
    outcomes: list[Any] = []

    def erase() -> None:
        try:
            erased, _already, _in_place, _loose = eraser.erase("fleet-a", order.erasure_id, 1)
            outcomes.append(len(erased))
        except Exception as error:  # the failure is the finding
            outcomes.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=erase) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return sorted(outcomes, key=str)


@pytest.mark.parametrize("imported", [True, False])
def test_a_run_never_held_erased_twice_at_once(service: ArtifactsService, imported: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    order = ErasureOrder("era_" + uuid.uuid4().hex[:28], "fleet-a", "gov",
                         (("run", "future-run", "a" * 64),), imported=imported)
    assert _twice_at_once(service, order, monkeypatch) == ([0, 1] if imported else [0, 0])
    with service.db.session() as session:
        kept = session.get(RunTombstoneRow, ("fleet-a", "future-run"))
    assert (kept is not None) == imported
    if not imported:  # the id is still free
        assert service.start_run("fleet-a", "scout", "future-run")[0].run_id == "future-run"


def test_a_run_erased_twice_at_once(service: ArtifactsService,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = service.start_run("fleet-a", "scout", "live-run")
    order = ErasureOrder("era_" + uuid.uuid4().hex[:28], "fleet-a", "gov",
                         (("run", "live-run", run_leaf(run.head_hash)),))
    assert _twice_at_once(service, order, monkeypatch) == [0, 1]


def test_events_and_snapshots_erased_twice_at_once_and_beside_an_append(
        service: ArtifactsService, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two carry-outs of one in-place erasure, both past reading the erasure: one tombstones
    the items, the other then finds them erased (counted, nothing rewritten); an append to the
    run beside them extends the chain, which verifies through the tombstones."""
    service.start_run("fleet-a", "scout", "kept-run")
    event, _ = service.append_event("fleet-a", "scout", "kept-run", "said", '{"n":1}')
    snapshot, _ = service.create_snapshot("fleet-a", "kept-run", '{"s":1}')
    order = ErasureOrder("era_" + uuid.uuid4().hex[:28], "fleet-a", "gov", (
        ("snapshot", snapshot.snapshot_id, snapshot.state_hash),
        ("event", "kept-run:1", event.hash)))

    class Source:
        def erasure(self, erasure_id: str) -> ErasureOrder:
            return order

    eraser = RunEraser(service, Source())
    together = threading.Barrier(3)
    lock_runs = item_erasure._lock_runs

    def held(*args: Any) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait(2)
        lock_runs(*args)

    monkeypatch.setattr(item_erasure, "_lock_runs", held)
    outcomes: list[Any] = []

    def erase() -> None:
        try:
            in_place = eraser.erase("fleet-a", order.erasure_id, 1)[2]
            outcomes.append((in_place.events, in_place.snapshots, in_place.already))
        except Exception as error:  # the failure is the finding
            outcomes.append(f"{type(error).__name__}: {error}")

    def append() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait(2)
        service.append_event("fleet-a", "scout", "kept-run", "said", '{"n":2}')

    threads = [threading.Thread(target=erase) for _ in range(2)] + [
        threading.Thread(target=append)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes, key=str) == [(0, 0, 2), (1, 1, 0)]
    replayed = list(service.replay("fleet-a", "kept-run"))
    assert [(e.seq, e.erased) for e in replayed] == [(1, True), (2, False)]
    assert service.latest_snapshot("fleet-a", "kept-run").erased
