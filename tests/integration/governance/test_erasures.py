"""RecordErasure / GetErasure against a real governance server, SQLite and Postgres: bad
requests are INVALID_ARGUMENT naming the problem, with nothing chained; a retry by
request_id records nothing new, and a reuse for other items is refused; another fleet's
erasure looks absent; an agent may not record one; an erasure row edited behind governance's
back is found by chain verification."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import sqlalchemy

from engram.client import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.db import normalize_url
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from tests.conftest import TokenFactory
from tests.integration.governance.conftest import GovClientFactory

LEAF = "ab" * 32


def _item(i: int = 0, kind: str = "record", leaf: str = LEAF) -> pb.ErasedItem:
    return pb.ErasedItem(kind=kind, id=f"{i:032x}", leaf_hash=leaf)


@pytest.mark.parametrize("kind,value,items,code,reason", [
    ("everything", "a", [_item()], grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SELECTOR"),
    ("match", "the secret text", [_item()], grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_SELECTOR"),
    ("agent", "bad agent/../", [_item()], grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_IDENTIFIER"),
    ("record", "r1", [], grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_ERASURE"),
    ("record", "r1", [_item(kind="table")], grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ITEM"),
    ("record", "r1", [_item(leaf="xyz")], grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ITEM"),
    ("record", "r1", [_item(), _item()], grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ITEM"),
    ("agent", "a", [_item(i) for i in range(10_001)], grpc.StatusCode.INVALID_ARGUMENT,
     "ERASURE_TOO_LARGE"),
])
def test_bad_erasures_are_refused_and_chain_nothing(
        gov_for: GovClientFactory, kind: str, value: str, items: list[pb.ErasedItem],
        code: grpc.StatusCode, reason: str) -> None:
    governor = gov_for()
    before = governor.checkpoint().length
    with pytest.raises(EngramRpcError) as refused:
        governor.record_erasure(kind, value, items)
    assert (refused.value.code, refused.value.reason) == (code, reason)
    assert governor.checkpoint().length == before


def test_an_erasure_is_chained_once_and_read_back_by_its_fleet_only(
        gov_for: GovClientFactory, gov_settings: GovernanceSettings) -> None:
    governor = gov_for()
    first = governor.record_erasure("agent", "scout-1", [_item(1), _item(2, "run")],
                                    reason="left the company", request_id="req-1")
    assert first.created and first.erasure.chain_seq >= 0
    again = governor.record_erasure("agent", "scout-1", [_item(1), _item(2, "run")],
                                    reason="left the company", request_id="req-1")
    assert not again.created and again.erasure == first.erasure
    with pytest.raises(EngramRpcError) as reused:
        governor.record_erasure("agent", "scout-1", [_item(3)], request_id="req-1")
    assert reused.value.reason == "REQUEST_ID_REUSED"
    erasure_id = first.erasure.erasure_id
    assert governor.erasure(erasure_id).requested_by == "gov-1"
    shard = gov_for("svc-shard", "system", ("service",))
    assert shard.erasure(erasure_id).fleet_id == "fleet-a"  # services read any fleet's
    for outsider in (gov_for("gov-2", "fleet-b"), gov_for("agent-1", "fleet-a", ("agent",))):
        with pytest.raises(EngramRpcError) as hidden:
            outsider.erasure(erasure_id)
        assert hidden.value.code in (grpc.StatusCode.NOT_FOUND,
                                     grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(EngramRpcError) as agent:
        gov_for("agent-1", "fleet-a", ("agent",)).record_erasure("record", "r", [_item()])
    assert agent.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert governor.verify_chain().ok

    engine = sqlalchemy.create_engine(normalize_url(gov_settings.database_url()))
    with engine.begin() as conn:  # hide one erased id behind governance's back
        conn.execute(sqlalchemy.text(
            "UPDATE erasures SET state_json = replace(state_json, :one, :other)"),
            {"one": f"{1:032x}", "other": f"{9:032x}"})
    engine.dispose()
    report = governor.verify_chain()
    assert not report.ok
    assert any(erasure_id in p for p in report.problems)


def test_a_fleet_records_at_most_its_daily_erasure_bytes(
        gov_db_url: str, engram_home: Path, make_token: TokenFactory) -> None:
    """Governance cannot check that an erasure's items exist, and its chain keeps every
    erasure: a governor could grow the chain every fleet shares with made-up items, 10,000 an
    erasure, at the write rate limit. A fleet now records a bounded size of erasures a day."""
    server = build_governance_server(GovernanceSettings(
        home=engram_home, db_url=gov_db_url, port=0, erasure_bytes_per_day=4000))
    server.start()
    try:
        with GovernanceClient(server.address, make_token("gov-1", "fleet-a", ("governor",))) \
                as mine, GovernanceClient(server.address,
                                          make_token("gov-2", "fleet-b", ("governor",))) as other:
            mine.record_erasure("agent", "a", [_item(i) for i in range(10)])
            with pytest.raises(EngramRpcError) as refused:
                mine.record_erasure("agent", "a", [_item(i) for i in range(10, 40)])
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.value.reason == "ERASURE_QUOTA"
            assert other.record_erasure("agent", "b", [_item(1)]).created  # its own quota
            before = mine.verify_chain()
            assert before.ok
            mine.record_erasure("agent", "a", [_item(50)])  # a small one still fits
    finally:
        server.stop(0)


def test_another_fleet_can_neither_take_nor_probe_an_erasure_id_before_it_is_recorded(
        gov_for: GovClientFactory) -> None:
    """Found by review: an erasure id derived from a request id was sha256(fleet, request id),
    which anyone can compute; erasure ids are global, so fleet A's admin imported an erasure
    under fleet B's future id (B's RecordErasure was then refused REQUEST_ID_REUSED) or
    probed which request ids B had used (ERASURE_CONFLICT or not). The id is now keyed with
    governance's secret: stable for B's retries, unknowable to A."""
    import hashlib

    public = "era_" + hashlib.sha256(b"fleet-b\x00forget-alice").hexdigest()[:28]
    squat = pb.Erasure(erasure_id=public, fleet_id="fleet-a", selector_kind="record",
                       selector_value=f"{7:032x}", requested_by="op", reason="squat",
                       items=[_item(7)])
    squat.create_time.FromMilliseconds(1_700_000_000_000)
    gov_for("op", "fleet-a", ("admin",)).import_erasures([squat])
    victim = gov_for("gov-9", "fleet-b")
    first = victim.record_erasure("record", f"{1:032x}", [_item(1)], request_id="forget-alice")
    assert first.created and first.erasure.fleet_id == "fleet-b"
    assert first.erasure.erasure_id != public
    again = victim.record_erasure("record", f"{1:032x}", [_item(1)], request_id="forget-alice")
    assert not again.created and again.erasure.erasure_id == first.erasure.erasure_id


def test_one_import_call_chains_at_most_ten_thousand_erasure_items(
        gov_for: GovClientFactory) -> None:
    """Found by review: one ImportErasures of 40 erasures x 10,000 items was chained under the
    head lock every fleet's gate and erasures wait on (fleet B's erasure took 4-6 s)."""
    admin = gov_for("op", "fleet-a", ("admin",))
    before = admin.checkpoint().length
    erasures = []
    for n in range(2):
        erasure = pb.Erasure(erasure_id=f"era_{n:028x}", fleet_id="fleet-a",
                             selector_kind="agent", selector_value="scout-1",
                             requested_by="op", items=[_item(n * 6000 + i) for i in range(6000)])
        erasure.create_time.FromMilliseconds(1_700_000_000_000)
        erasures.append(erasure)
    with pytest.raises(EngramRpcError) as refused:
        admin.import_erasures(erasures)
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                           "IMPORT_TOO_LARGE")
    assert admin.checkpoint().length == before
    assert admin.import_erasures(erasures[:1]).created == 1
