"""An event item's seq no store holds (beyond a signed 64-bit INTEGER), in an erasure recorded
or imported before governance refused one: ForgetRuns takes the item as not found (NOT_FOUND
EVENT_NOT_FOUND; an imported erasure's is nothing to do), never failing INTERNAL inside the
database driver (SQLite OverflowError, Postgres DataError). Found by review."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.artifacts.erasure import RunEraser
from services.artifacts.server import MIGRATIONS
from services.artifacts.service import ArtifactsService
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.common.erasure_source import ErasureOrder
from services.common.errors import NotFound


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ArtifactsService]:
    database = Database(f"sqlite:///{tmp_path / 'a.db'}")
    database.upgrade(MIGRATIONS)
    yield ArtifactsService(database, FileBlobStore(tmp_path / "blobs"))
    database.engine.dispose()


def test_an_event_seq_no_store_holds_is_not_found_never_a_driver_error(
        service: ArtifactsService) -> None:
    # Governance now refuses such a seq; one recorded or imported before it did made SQLite
    # raise OverflowError (Postgres DataError) in the lookup: ForgetRuns failed INTERNAL.
    service.start_run("f", "a", "r")
    event, _ = service.append_event("f", "a", "r", "said", '{"n":1}')
    huge = "r:" + "9" * 25
    orders = {
        "era_" + "4" * 28: ErasureOrder("era_" + "4" * 28, "f", "op", (
            ("event", "r:1", event.hash), ("event", huge, event.hash))),
        "era_" + "5" * 28: ErasureOrder("era_" + "5" * 28, "f", "op", (
            ("event", f"r:{2**63}", event.hash), ("event", "r:1", event.hash)), imported=True),
    }

    class Source:
        def erasure(self, erasure_id: str) -> ErasureOrder:
            return orders[erasure_id]

    eraser = RunEraser(service, Source())
    with pytest.raises(NotFound) as absent:
        eraser.erase("f", "era_" + "4" * 28, 7)
    assert absent.value.reason == "EVENT_NOT_FOUND"
    assert not [e for e in service.replay("f", "r") if e.erased]  # nothing half-done
    # imported: an item never held here is nothing to do; the rest is erased
    in_place = eraser.erase("f", "era_" + "5" * 28, 8)[2]
    assert (in_place.events, in_place.already) == (1, 0)
