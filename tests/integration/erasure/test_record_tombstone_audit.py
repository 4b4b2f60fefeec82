"""VerifyRecords checks every record tombstone against the erasure governance recorded
(docs/erasure.md), through real servers on SQLite and Postgres: a record deleted in the shard's
database and a tombstone put in its place (no erasure, no governance) under an erasure id no
recorded erasure of the fleet lists it by (another fleet's erasure, an id governance never
issued, a real erasure of the fleet that lists other records, one that lists the record under
another leaf) is reported TOMBSTONE_NOT_IN_ERASURE naming the record and the erasure, in one
call, page by page and by id; a genuine erasure's tombstone passes. With governance down the
call still answers and counts the tombstones it could not confirm; `engram verify` exits 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from engram.client import ShardClient
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as pb
from services.common.db import normalize_url
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.stack import full_stack

FLEET = "fleet-t"
NEVER = "era_" + "f" * 28  # of governance's form, never recorded
_KEPT = ("id, seq, fleet_id, run_id, agent_id, format, body_commitment, record_hash, domain, "
         "source, importance, cross_refs_json, created_us, gate_decision_id")


@pytest.fixture(params=["sqlite", "postgres"])
def shard_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'shard.db'}"
    return str(request.getfixturevalue("fresh_postgres_urls")())


def _forge_tombstone(url: str, record_id: str, erasure_id: str) -> None:
    """What someone with write access to the shard's database does: the record's row goes,
    a well-formed tombstone (its kept fields re-derive its record_hash) takes its place."""
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                f"INSERT INTO record_tombstones ({_KEPT}, erasure_id, erased_us, erased_by) "
                f"SELECT {_KEPT}, :erasure_id, 7, 'op' FROM records WHERE id = :id"),
                {"id": record_id, "erasure_id": erasure_id})
            conn.execute(sa.text("DELETE FROM records WHERE id = :id"), {"id": record_id})
    finally:
        engine.dispose()


def _found(report: pb.VerifyRecordsResponse) -> set[tuple[str, str, str]]:
    return {(f.id, f.reason, f.erasure_id) for f in report.failures}


def _paged(shard: ShardClient, page_size: int) -> pb.VerifyRecordsResponse:
    total = pb.VerifyRecordsResponse()
    for page in shard.verify_pages(page_size):
        total.checked += page.checked
        total.tombstoned += page.tombstoned
        total.tombstones_unconfirmed += page.tombstones_unconfirmed
        total.failures.extend(page.failures)
    return total


def test_verify_records_reports_tombstones_no_recorded_erasure_lists(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory, shard_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    other_admin = make_token("op", "fleet-o", ADMIN)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    with full_stack(data, engram_home, make_token, {"shard": shard_url},
                    governed=True) as stack:
        with ShardClient(stack.shard.address, agent) as shard:
            made = [shard.add(f"note number {n} about the harbour", run_id="run-t",
                              request_id=f"req-{n}").record for n in range(7)]
        erased, theirs, never, other, wrong_leaf, bad, kept = made
        with GovernanceClient(stack.governance.address, admin) as gov:
            genuine = gov.record_erasure("record", erased.id, [
                gpb.ErasedItem(kind="record", id=erased.id, leaf_hash=erased.record_hash),
            ], reason="subject asked").erasure.erasure_id
            # a real erasure of this fleet listing the record, under a leaf it does not have
            leaf = gov.record_erasure("record", wrong_leaf.id, [
                gpb.ErasedItem(kind="record", id=wrong_leaf.id, leaf_hash="0" * 64),
            ]).erasure.erasure_id
        with GovernanceClient(stack.governance.address, other_admin) as gov:
            # another fleet's erasure listing this very record: not this fleet's erasure
            elsewhere = gov.record_erasure("record", theirs.id, [
                gpb.ErasedItem(kind="record", id=theirs.id, leaf_hash=theirs.record_hash),
            ]).erasure.erasure_id
        with ShardClient(stack.shard.address, admin) as shard:
            assert [r.record_id for r in shard.forget(erasure_id=genuine).records] == [erased.id]
            clean = shard.verify(all_records=True)
            assert (clean.checked, clean.tombstoned, clean.tombstones_unconfirmed,
                    list(clean.failures)) == (6, 1, 0, [])
            assert not shard.verify([erased.id]).failures

        _forge_tombstone(shard_url, theirs.id, elsewhere)
        _forge_tombstone(shard_url, never.id, NEVER)
        _forge_tombstone(shard_url, other.id, genuine)  # a real erasure listing another
        _forge_tombstone(shard_url, wrong_leaf.id, leaf)
        _forge_tombstone(shard_url, bad.id, "x")  # not even an erasure id: its form says so

        forged = {(theirs.id, "TOMBSTONE_NOT_IN_ERASURE", elsewhere),
                  (never.id, "TOMBSTONE_NOT_IN_ERASURE", NEVER),
                  (other.id, "TOMBSTONE_NOT_IN_ERASURE", genuine),
                  (wrong_leaf.id, "TOMBSTONE_NOT_IN_ERASURE", leaf),
                  (bad.id, "INVALID_TOMBSTONE", "x")}
        forged_ids = [theirs.id, never.id, other.id, wrong_leaf.id, bad.id]
        with ShardClient(stack.shard.address, admin) as shard:
            whole = shard.call(shard.stub.VerifyRecords, pb.VerifyRecordsRequest(all=True))
            for report in (whole, shard.verify(all_records=True), _paged(shard, 2)):
                assert _found(report) == forged
                assert (report.checked, report.tombstoned,
                        report.tombstones_unconfirmed) == (1, 6, 0)
            by_id = shard.verify([*forged_ids, erased.id, kept.id])
            assert _found(by_id) == forged
            assert (by_id.checked, by_id.tombstoned) == (1, 6)
            expected = {f.id: f.expected_hash for f in by_id.failures}
            assert expected[theirs.id] == theirs.record_hash
            assert expected[wrong_leaf.id] == wrong_leaf.record_hash
        with ShardClient(stack.shard.address, agent) as shard:  # an agent pages its fleet
            assert _found(_paged(shard, 3)) == forged

        with cli_for(stack, admin, monkeypatch) as run:
            shown = run("verify", "--all", code=1)
            assert {(f["id"], f["reason"], f["erasure_id"])
                    for f in shown["failures"]} == forged
            assert (shown["tombstoned"], shown["tombstones_unconfirmed"], shown["ok"]) == (
                6, 0, False)
            assert run("verify", erased.id)["ok"]

        # Governance down: the erasures it answered before are kept by the shard (a recorded
        # erasure never changes), so their tombstones are still checked; the one governance
        # never had cannot be confirmed now, and does not fail.
        stack.governance.stop(0)
        with ShardClient(stack.shard.address, admin) as shard:
            report = shard.verify(all_records=True)
            assert _found(report) == forged - {(never.id, "TOMBSTONE_NOT_IN_ERASURE", NEVER)}
            assert (report.tombstoned, report.tombstones_unconfirmed) == (6, 1)
            alone = shard.verify([erased.id])
            assert (alone.tombstoned, alone.tombstones_unconfirmed, list(alone.failures)) == (
                1, 0, [])
        with cli_for(stack, admin, monkeypatch) as run:
            unconfirmed = run("verify", never.id, code=2)
            assert (unconfirmed["tombstones_unconfirmed"], unconfirmed["failures"],
                    unconfirmed["ok"]) == (1, [], False)
            assert run("verify", "--all", code=1)["tombstones_unconfirmed"] == 1

        # The shard unreachable: not verified either; 2 with the call's error, never 0 (README)
        stack.shard.stop(0)
        with cli_for(stack, admin, monkeypatch) as run:
            failed = run("verify", "--all", code=2)
            assert failed["error"]["code"] == "UNAVAILABLE" and "ok" not in failed
