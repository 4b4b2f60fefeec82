"""VerifyArtifacts' tombstone audit (services/artifacts/tombstone_audit.py, docs/erasure.md):
each tombstone is checked against the erasure it names, governance asked once per erasure id;
an erasure of another fleet, or one governance has not, lists nothing; a tombstone not of the
form is INVALID_TOMBSTONE without asking; once governance failed to answer, the rest are
unconfirmed (not failed, not passed) and it is not asked again in that call. Tombstones' erasure
ids have the form governance issues and imports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.artifacts.domain.entities import StoredTombstone
from services.artifacts.server import MIGRATIONS
from services.artifacts.service import ArtifactsService
from services.artifacts.tables import EventRow
from services.artifacts.tombstone_audit import audit_tombstones
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.common.erasure_source import ErasureOrder, is_erasure_id
from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.governance.domain.erasures import check_erasure_id, erasure_id_for

ERA_A, ERA_B, ERA_C = ("era_" + c * 28 for c in "abc")


class Source:
    def __init__(self, orders: dict[str, ErasureOrder], down: bool = False) -> None:
        self.orders, self.down = orders, down
        self.asked: list[str] = []

    def erasure(self, erasure_id: str) -> ErasureOrder:
        self.asked.append(erasure_id)
        if self.down:
            raise Unavailable("governance service at x did not answer",
                              reason="GOVERNANCE_UNAVAILABLE")
        if erasure_id not in self.orders:
            raise NotFound(f"no erasure {erasure_id}", reason="ERASURE_NOT_FOUND")
        return self.orders[erasure_id]


def _t(kind: str, item_id: str, leaf: str, erasure_id: str, ok: bool = True) -> StoredTombstone:
    return StoredTombstone(kind, item_id, item_id.split(":")[0], leaf, erasure_id, ok)


TOMBSTONES = [
    _t("event", "r:1", "1" * 64, ERA_A),  # listed
    _t("event", "r:2", "2" * 64, ERA_A),  # its erasure does not list it
    _t("event", "r:3", "3" * 64, ERA_B),  # another fleet's erasure
    _t("event", "r:4", "4" * 64, ERA_C),  # no such erasure
    _t("event", "r:5", "5" * 64, "x", ok=False),  # not a tombstone's form
    _t("snapshot", "snap_1", "6" * 64, ERA_A),  # listed
    _t("snapshot", "snap_2", "7" * 64, ERA_A, ok=False),  # a snapshot problem of its own
]
ORDERS = {ERA_A: ErasureOrder(ERA_A, "f", "op", (("event", "r:1", "1" * 64),
                                                 ("snapshot", "snap_1", "6" * 64))),
          ERA_B: ErasureOrder(ERA_B, "g", "op", (("event", "r:3", "3" * 64),))}


def test_each_tombstone_is_checked_against_its_erasure_asked_once() -> None:
    source = Source(ORDERS)
    audit = audit_tombstones(TOMBSTONES, source, "f")
    assert {(p.id, p.problem) for p in audit.problems} == {
        ("r:2", "TOMBSTONE_NOT_IN_ERASURE"), ("r:3", "TOMBSTONE_NOT_IN_ERASURE"),
        ("r:4", "TOMBSTONE_NOT_IN_ERASURE"), ("r:5", "INVALID_TOMBSTONE")}
    assert (audit.events, audit.snapshots, audit.unconfirmed) == (5, 1, 0)
    assert sorted(source.asked) == [ERA_A, ERA_B, ERA_C]  # cached within the call


@pytest.mark.parametrize("source", [None, Source(ORDERS, down=True)])
def test_without_governance_tombstones_are_unconfirmed_not_failed(source: Any) -> None:
    audit = audit_tombstones(TOMBSTONES, source, "f")
    assert [(p.id, p.problem) for p in audit.problems] == [("r:5", "INVALID_TOMBSTONE")]
    assert (audit.events, audit.snapshots, audit.unconfirmed) == (5, 1, 5)
    if source is not None:
        assert source.asked == [ERA_A]  # down once: not asked again in this call


def test_tombstone_problems_are_counted_as_integrity_failures(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'a.db'}")
    database.upgrade(MIGRATIONS)
    service = ArtifactsService(database, FileBlobStore(tmp_path / "blobs"))
    try:
        service.start_run("f", "a", "r")
        for n in range(3):
            service.append_event("f", "a", "r", "said", f'{{"n":{n}}}')
        with service.db.session() as session:
            for seq, erasure_id in ((1, ERA_C), (3, "x")):
                row = session.get(EventRow, ("f", "r", seq))
                assert row is not None
                row.payload_json, row.salt, row.erasure_id, row.erased_us = "", "", erasure_id, 9
        found = [(t.id, t.well_formed) for t in service.tombstones("f", "r")]
        assert found == [("r:1", True), ("r:3", False)]
        audit = service.verify_tombstones("f", "", Source({}))
        assert {(p.id, p.problem) for p in audit.problems} == {
            ("r:1", "TOMBSTONE_NOT_IN_ERASURE"), ("r:3", "INVALID_TOMBSTONE")}
        assert dict(service.integrity_failures.items()) == {
            ("TOMBSTONE_NOT_IN_ERASURE",): 1, ("INVALID_TOMBSTONE",): 1}
    finally:
        database.engine.dispose()


@pytest.mark.parametrize("erasure_id", ["era_" + "0" * 28, "era_" + "9af" * 9 + "e"])
def test_the_form_is_governances(erasure_id: str) -> None:
    assert is_erasure_id(erasure_id) and check_erasure_id(erasure_id)
    assert is_erasure_id(erasure_id_for("f", "req-1")) and is_erasure_id(erasure_id_for("f", ""))
    for bad in ("x", "era_", erasure_id.upper(), erasure_id + "0", erasure_id[:-1], " " +
                erasure_id):
        assert not is_erasure_id(bad)
        with pytest.raises(InvalidArgument):
            check_erasure_id(bad)
