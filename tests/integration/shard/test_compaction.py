"""Memory compaction and retention through the shard API (the compactor's contract)."""

from __future__ import annotations

import json

import grpc
import pytest
from sqlalchemy import select

from engram.client import EngramRpcError
from services.shard.service import ShardService
from services.shard.tables import WRITE_KEYS
from tests.integration.shard.conftest import ClientFactory

DAY = 86400.0


def test_old_unimportant_records_are_summarised_not_lost(
    client_for: ClientFactory, shard: tuple[str, ShardService]
) -> None:
    agent = client_for("agent-1", "fleet-a")
    service = shard[1]
    real_clock = service.clock
    service.clock = lambda: real_clock() - 90 * DAY  # write "three months ago"
    try:
        old = [
            agent.add(f"task: minor chore number {i}", importance=0.2, run_id="r1").record
            for i in range(3)
        ]
        keep = agent.add("task: critical migration plan", importance=0.9, run_id="r1").record
    finally:
        service.clock = real_clock
    fresh = agent.add("task: minor chore from today", importance=0.1, run_id="r1").record
    # A record that cites an old one: cross-reference expansion reaches the original now...
    citing = agent.add(f"audit note, follows up shard:{old[0].id}", run_id="r2").record
    crossed = {h.record.id: h.via for h in agent.search("audit note", cross=True)}
    assert crossed[citing.id] == "direct" and crossed[old[0].id] == "cross_ref"

    compactor = client_for("svc-compactor", "system", ("service",))
    with pytest.raises(EngramRpcError) as caught:
        compactor.compact()
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED  # must name the fleet

    dry = compactor.compact("fleet-a", dry_run=True)
    assert dry.compacted == 3 and not dry.groups[0].HasField("summary")
    report = compactor.compact("fleet-a")
    assert report.examined == 6 and report.compacted == 3
    group = report.groups[0]
    assert set(group.replaced_ids) == {r.id for r in old}
    assert set(group.replaced_hashes) == {r.record_hash for r in old}
    replaced = json.loads(group.summary.metadata["replaces"])
    assert {item["id"] for item in replaced} == {r.id for r in old}

    hits = {h.record.id for h in agent.search("minor chore")}
    assert group.summary.id in hits and fresh.id in hits
    assert not hits & {r.id for r in old}  # originals no longer crowd search
    # ...and not once a summary covers it.
    crossed = {h.record.id for h in agent.search("audit note", cross=True)}
    assert citing.id in crossed and old[0].id not in crossed
    assert keep.id in {h.record.id for h in agent.search("critical migration")}
    assert agent.verify([r.id for r in old]).failures == []  # still stored and verifiable
    assert compactor.compact("fleet-a").compacted == 0  # idempotent

    assert compactor.apply_retention("fleet-a", 365) == []
    removed = compactor.apply_retention("fleet-a", 30, dry_run=True)
    assert set(removed) == {r.id for r in old}
    index = service.search_engine.index
    assert index is not None
    held = index.records()
    assert set(compactor.apply_retention("fleet-a", 30)) == {r.id for r in old}
    with pytest.raises(EngramRpcError):
        agent.get(old[0].id)
    assert agent.get(group.summary.id).content.startswith("Summary of 3 older memories")
    # What derived from their content went with them: the search index (and its snapshot)
    # and the write keys; the same text again is stored anew (before: the index kept them)
    assert index.records() == held - 3
    with service.db.session() as session:
        assert session.execute(select(WRITE_KEYS.c.record_id).where(
            WRITE_KEYS.c.record_id.in_([r.id for r in old]))).all() == []
    again = agent.add("task: minor chore number 0", importance=0.2, run_id="r1")
    assert again.created and again.record.id not in {r.id for r in old}



@pytest.mark.parametrize("days", [float("inf"), float("nan"), 1e12, -1.0])
def test_a_policy_age_no_store_can_hold_is_invalid_argument(
        client_for: ClientFactory, days: float) -> None:
    """Infinity, NaN and 1e12 days failed INTERNAL in the cut-off's arithmetic or its SQL
    (found by review on 2026-11-30); a retention needs an age over 0 too."""
    compactor = client_for("svc-compactor", "system", ("service",))
    for call in (lambda: compactor.apply_retention("fleet-a", days),
                 lambda: compactor.apply_retention("fleet-a", 0.0),
                 lambda: compactor.compact("fleet-a", older_than_days=days)):
        with pytest.raises(EngramRpcError) as caught:
            call()
        assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                            "INVALID_POLICY")
