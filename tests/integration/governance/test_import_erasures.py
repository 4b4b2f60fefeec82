"""ListErasures / ImportErasures between two real governance servers (SQLite or Postgres at
the origin): erasures move as they were, chained here as imported entries the full
verification replays; importing twice changes nothing; admin of the same fleet only; a bad,
conflicting, future-dated or unbounded erasure is refused with nothing chained."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.server import EngramServer
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from tests.conftest import TokenFactory
from tests.integration.governance.conftest import admin, refused


def _item(i: int, kind: str = "record") -> pb.ErasedItem:
    return pb.ErasedItem(kind=kind, id=f"{i:032x}", leaf_hash=f"{i:064x}")


@pytest.fixture
def exported(governor: GovernanceClient) -> list[pb.Erasure]:
    """Three erasures at the origin, as an export lists them (oldest first)."""
    governor.record_erasure("record", f"{1:032x}", [_item(1)], reason="asked to")
    governor.record_erasure("agent", "scout-1", [_item(2), _item(3), _item(4, "run")])
    governor.record_erasure("match", "", [_item(5)], reason="a phone number")
    erasures = list(governor.erasures(page_size=2))  # pages follow on
    assert [e.selector_kind for e in erasures] == ["record", "agent", "match"]
    return erasures


def test_erasures_move_as_they_were_and_the_chain_replays_them(
        exported: list[pb.Erasure], target: EngramServer, make_token: TokenFactory) -> None:
    with admin(target, make_token) as gov:
        reply = gov.import_erasures(exported)
        assert (reply.created, reply.already_present) == (3, 0)
        again = gov.import_erasures(exported)
        assert (again.created, again.already_present) == (0, 3)
        moved = list(gov.erasures())
        for before, after in zip(exported, moved, strict=True):
            assert after.imported and not before.imported  # where it was recorded
            for message in (before, after):
                message.ClearField("chain_seq")
                message.ClearField("imported")
            assert before == after
        assert gov.erasure(exported[0].erasure_id).reason == "asked to"
        assert gov.verify_chain().ok  # replays the erasure.imported entries
    with admin(target, make_token, "fleet-b") as other:
        assert list(other.erasures()) == []  # another fleet's erasures are not listed


def bad(exported: list[pb.Erasure], **changes: object) -> pb.Erasure:
    erasure = pb.Erasure()
    erasure.CopyFrom(exported[0])
    for name, value in changes.items():
        if name == "seconds":
            erasure.create_time.seconds = int(value)  # type: ignore[call-overload]
        elif name == "items":
            del erasure.items[:]
            erasure.items.extend(value)  # type: ignore[arg-type]
        else:
            setattr(erasure, name, value)
    return erasure


@pytest.mark.parametrize("changes,code,reason", [
    ({"erasure_id": "era_../../x"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ERASURE_ID"),
    ({"erasure_id": "not-an-erasure"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ERASURE_ID"),
    ({"fleet_id": "fleet-b"}, grpc.StatusCode.PERMISSION_DENIED, "FLEET_MISMATCH"),
    ({"selector_kind": "everything"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SELECTOR"),
    ({"items": []}, grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_ERASURE"),
    ({"items": [_item(i) for i in range(10_001)]}, grpc.StatusCode.INVALID_ARGUMENT,
     "ERASURE_TOO_LARGE"),
    ({"requested_by": "bad agent/.."}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER"),
    ({"reason": "x" * 1001}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REASON"),
    ({"seconds": 4_000_000_000}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ERASURE"),
    ({"seconds": 400_000_000_000}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ERASURE"),
])
def test_bad_erasures_are_refused_with_nothing_chained(
        exported: list[pb.Erasure], target: EngramServer, make_token: TokenFactory,
        changes: dict[str, object], code: grpc.StatusCode, reason: str) -> None:
    with admin(target, make_token) as gov:
        before = gov.checkpoint().length
        # The good one first in the batch: all or nothing.
        error = refused(gov.import_erasures, [exported[1], bad(exported, **changes)])
        assert (error.code, error.reason) == (code, reason)
        assert gov.checkpoint().length == before
        assert list(gov.erasures()) == []


def test_a_conflicting_erasure_is_refused_and_nothing_of_the_call_is_stored(
        exported: list[pb.Erasure], target: EngramServer, make_token: TokenFactory) -> None:
    with admin(target, make_token) as gov:
        gov.import_erasures(exported[:1])
        before = gov.checkpoint().length
        error = refused(gov.import_erasures, [exported[1], bad(exported, reason="another")])
        assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "ERASURE_CONFLICT")
        assert gov.checkpoint().length == before
        assert [e.erasure_id for e in gov.erasures()] == [exported[0].erasure_id]


def test_only_an_admin_imports_and_only_governors_list(
        exported: list[pb.Erasure], target: EngramServer, make_token: TokenFactory) -> None:
    for role in ("governor", "agent"):
        with admin(target, make_token, role=role) as gov:
            error = refused(gov.import_erasures, exported)
            assert error.code == grpc.StatusCode.PERMISSION_DENIED, role
    for role in ("agent",):
        with admin(target, make_token, role=role) as gov:
            error = refused(lambda: list(gov.erasures()))
            assert error.code == grpc.StatusCode.PERMISSION_DENIED, role
    with admin(target, make_token) as gov:
        error = refused(gov.import_erasures, [])
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_BATCH")
        error = refused(gov.import_erasures, exported[:1] * 1001)  # ENGRAM_LIMITS_BATCH_ITEMS
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                              "BATCH_TOO_LARGE")
        assert list(gov.erasures()) == []
        for token in ("not-a-token", "x" * 2000):
            error = refused(gov.call, gov.stub.ListErasures,
                            pb.ListErasuresRequest(page_token=token))
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                  "INVALID_PAGE_TOKEN"), token


def test_imported_erasures_do_not_use_up_the_fleets_daily_quota(
        exported: list[pb.Erasure], engram_home: Path, tmp_path: Path,
        make_token: TokenFactory) -> None:
    """Found in review: they counted, so an import (or an admin's forged erasures dated now)
    refused the governors' own erasures for a day (checked failing without the fix)."""
    server = build_governance_server(GovernanceSettings(
        home=engram_home, db_url=f"sqlite:///{tmp_path / 'small.db'}", port=0,
        erasure_bytes_per_day=2000))
    server.start()
    try:
        big = bad(exported, items=[_item(i) for i in range(100)])  # about 16 KB, dated now
        with admin(server, make_token) as gov:
            assert gov.import_erasures([big]).created == 1
        with admin(server, make_token, role="governor") as gov:
            assert gov.record_erasure("record", f"{1:032x}", [_item(1)]).created
    finally:
        server.stop(0)


def test_a_page_of_erasures_stops_at_its_byte_budget(
        exported: list[pb.Erasure], target: EngramServer, make_token: TokenFactory) -> None:
    """An erasure lists up to 10,000 items (~1 MB); a page of 1,000 of them was 110 MB, past
    every message limit (found in review)."""
    with admin(target, make_token) as gov:
        large = []
        for n in range(4):
            erasure = bad(exported, items=[_item(n * 10_000 + i) for i in range(10_000)])
            erasure.erasure_id = f"era_{n:028x}"
            gov.import_erasures([erasure])
            large.append(erasure.erasure_id)
        pages = []
        request = pb.ListErasuresRequest(page_size=1000)
        while True:
            reply = gov.call(gov.stub.ListErasures, request)
            pages.append([e.erasure_id for e in reply.erasures])
            assert reply.ByteSize() <= 4 * 1024 * 1024
            if not reply.next_page_token:
                break
            request.page_token = reply.next_page_token
        assert [i for page in pages for i in page] == large and len(pages) >= 2
        assert all(e.imported for e in gov.erasures())
