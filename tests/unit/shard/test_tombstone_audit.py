"""VerifyRecords' audit of record tombstones (services/shard/service.py, docs/erasure.md): each
tombstone of a tombstone's form is checked against the erasure it names, as governance recorded
it for the fleet (listed as a record or a summary under the record_hash it kept); governance is
asked once per erasure id within a call, page by page and in the whole-fleet call alike, and
with no database session open; once it failed to answer, the rest are unconfirmed and it is not
asked again in that call."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import insert

import services.shard.service as shard_service
from services.common.db import Database
from services.common.erasure_source import ErasureOrder
from services.common.tokens import Principal
from services.shard.domain.records import Tombstone
from services.shard.server import MIGRATIONS
from services.shard.service import ShardService
from services.shard.tables import TombstoneRow, tombstone_values
from tests.unit.artifacts.test_tombstone_audit import Source as Governance
from tests.unit.shard.test_records_v2 import _tombstone, _v2

ERA_A, ERA_B, ERA_C, ERA_D = ("era_" + c * 28 for c in "abcd")
ADMIN = Principal(agent_id="op", fleet_id="f", roles=frozenset({"admin"}))


class Source(Governance):
    """The artifacts audit's governance stand-in, which also counts what it was asked with a
    database session open."""

    def __init__(self, orders: dict[str, ErasureOrder], down: bool = False) -> None:
        super().__init__(orders, down)
        self.in_session = False
        self.asked_in_session = 0

    def erasure(self, erasure_id: str) -> ErasureOrder:
        self.asked_in_session += self.in_session
        return super().erasure(erasure_id)


def _stones() -> tuple[list[Tombstone], dict[str, ErasureOrder], set[str]]:
    """Tombstones under four erasures, interleaved by seq; which are forged."""
    made = [_tombstone(_v2(f"note {n}")) for n in range(8)]
    named = [ERA_A, ERA_B, ERA_A, ERA_C, ERA_A, ERA_B, ERA_D, ERA_A]
    stones = [replace(t, erasure_id=e) for t, e in zip(made, named, strict=True)]
    orders = {
        ERA_A: ErasureOrder(ERA_A, "f", "op", (
            ("record", stones[0].id, stones[0].record_hash),
            ("summary", stones[2].id, stones[2].record_hash),  # a summary is a record too
            ("record", stones[4].id, "0" * 64),  # listed under another leaf: forged
            ("record", stones[7].id, stones[7].record_hash))),
        ERA_B: ErasureOrder(ERA_B, "f", "op", (
            ("record", stones[1].id, stones[1].record_hash),
            ("record", stones[5].id, stones[5].record_hash))),
        ERA_C: ErasureOrder(ERA_C, "g", "op", (  # another fleet's erasure
            ("record", stones[3].id, stones[3].record_hash),)),
        # ERA_D: governance has no such erasure
    }
    return stones, orders, {stones[3].id, stones[4].id, stones[6].id}


@pytest.fixture
def service(tmp_path: Path) -> ShardService:
    database = Database(f"sqlite:///{tmp_path / 'shard.db'}")
    database.upgrade(MIGRATIONS)
    return ShardService(database)


def _store(service: ShardService, stones: list[Tombstone]) -> None:
    with service.db.session() as session:
        session.execute(insert(TombstoneRow), [tombstone_values(t, seq)
                                               for seq, t in enumerate(stones, start=1)])
        session.commit()


def _watch_sessions(service: ShardService, source: Source,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    opened = service.db.session

    def session():  # type: ignore[no-untyped-def]
        manager = opened()

        class Watched:
            def __enter__(self):  # type: ignore[no-untyped-def]
                source.in_session = True
                return manager.__enter__()

            def __exit__(self, *exc):  # type: ignore[no-untyped-def]
                source.in_session = False
                return manager.__exit__(*exc)
        return Watched()
    monkeypatch.setattr(service.db, "session", session)


def test_each_tombstone_is_checked_against_its_erasure_once_per_page(
        service: ShardService, monkeypatch: pytest.MonkeyPatch) -> None:
    stones, orders, forged = _stones()
    _store(service, stones)
    source = Source(orders)
    _watch_sessions(service, source, monkeypatch)
    found, after, pages = set(), None, 0
    while True:
        report, after = service.verify_page(ADMIN, after, 3, erasures=source)
        pages += 1
        assert report.unconfirmed == 0
        found |= {(f.metadata["record_id"], f.reason) for f in report.failures}
        if after is None:
            break
    assert found == {(i, "TOMBSTONE_NOT_IN_ERASURE") for i in forged}
    # pages of 3: [A B A] [C A B] [D A]; an erasure governance answered is not asked again
    # on a later page (the service keeps what governance recorded: it never changes)
    assert source.asked == [ERA_A, ERA_B, ERA_C, ERA_D]
    assert source.asked_in_session == 0


@pytest.mark.parametrize("chunk", [3, 1000])
def test_the_whole_fleet_call_asks_each_erasure_once(
        service: ShardService, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    stones, orders, forged = _stones()
    _store(service, stones)
    source = Source(orders)
    _watch_sessions(service, source, monkeypatch)
    monkeypatch.setattr(shard_service, "AUDIT_CHUNK", chunk)
    report = service.verify(ADMIN, [], True, erasures=source)
    assert {f.metadata["record_id"] for f in report.failures} == forged
    assert all(f.reason == "TOMBSTONE_NOT_IN_ERASURE" for f in report.failures)
    assert (report.tombstoned, report.unconfirmed) == (8, 0)
    assert sorted(source.asked) == [ERA_A, ERA_B, ERA_C, ERA_D]
    assert source.asked_in_session == 0
    by_id = service.verify(ADMIN, [t.id for t in stones], False, erasures=source)
    assert {f.metadata["record_id"] for f in by_id.failures} == forged


@pytest.mark.parametrize("source", [None, Source({}, down=True)], ids=["none", "down"])
def test_without_governance_tombstones_are_unconfirmed_not_failed(
        service: ShardService, source: Source | None) -> None:
    stones, _, _ = _stones()
    bad = replace(_tombstone(_v2("malformed")), erasure_id="x")
    _store(service, [*stones, bad])
    report = service.verify(ADMIN, [], True, erasures=source)
    assert [(f.metadata["record_id"], f.reason) for f in report.failures] == [
        (bad.id, "INVALID_TOMBSTONE")]  # its form alone says so; governance is not asked
    assert (report.tombstoned, report.unconfirmed) == (9, 8)
    if source is not None:
        assert source.asked == [ERA_A]  # not asked again in the call
    page, _ = service.verify_page(ADMIN, None, 100, erasures=source)
    assert (page.tombstoned, page.unconfirmed) == (9, 8)


def test_tombstone_problems_are_counted_as_integrity_failures(service: ShardService) -> None:
    stones, orders, forged = _stones()
    _store(service, stones)
    service.verify(ADMIN, [], True, erasures=Source(orders))
    assert dict(service.integrity_failures.items())[("TOMBSTONE_NOT_IN_ERASURE",)] \
        == len(forged)
