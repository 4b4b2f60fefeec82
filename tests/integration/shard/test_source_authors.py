"""A record's ``source_authors`` metadata is free text any writer sets, and every search of
the fleet reads it: a writer must not be able to break the fleet's searches with it, nor lift
a suspended agent's records back into them (found by review, 2026-11-28).

Before the fix: ``"[" * 5000`` made every search whose candidates held the record INTERNAL
(RecursionError in the JSON parser); a name governance refuses as an agent id made the
shard's whole trust lookup fail, which it took for an outage and ranked every author it had
not cached at 1.0, a suspended one included.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from pathlib import Path

from engram.client import GovernanceClient, ShardClient
from services.shard.domain.compaction import MAX_GROUP
from services.shard.governance_gate import GovernanceTrust
from services.shard.search.engine import MAX_SOURCE_AUTHORS
from tests.stack import gated_stack


def _wait_searchable(client: ShardClient, query: str, want: int) -> None:
    deadline = time.monotonic() + 20
    while len(client.search(query, limit=10, mode="lexical")) < want:
        assert time.monotonic() < deadline, f"{query!r} not searchable after 20 s"
        time.sleep(0.05)


def test_source_authors_cannot_break_search_or_lift_a_suspension(
        tmp_path: Path, engram_home: Path, make_token) -> None:
    with gated_stack(tmp_path, engram_home, make_token) as stack:
        address = stack.shard.address
        mallory = ShardClient(address, make_token("mallory", "fleet-a"))
        reader = ShardClient(address, make_token("reader", "fleet-a"))
        suspect = ShardClient(address, make_token("bad-agent", "fleet-a"))
        governor = GovernanceClient(stack.governance.address,
                                    make_token("gov-1", "fleet-a", ("governor",)))
        suspect.add("launch codes rotation procedure from bad-agent", run_id="r1")
        governor.set_tier("bad-agent", "suspended", reason="compromised")
        mallory.add("launch codes rotation notes zebra", run_id="r2",
                    metadata={"source_authors": '["not an id!"]'})
        mallory.add("launch codes rotation deeply nested zebra", run_id="r3",
                    metadata={"source_authors": "[" * 5000})
        # a query only mallory's records answer: once they are in, the suspect's is too, and
        # the suspect's trust has not been looked up yet (nothing of it was a candidate)
        _wait_searchable(reader, "zebra", 2)

        hits = reader.search("launch codes rotation", limit=10, mode="lexical")
        authors = [hit.record.agent_id for hit in hits]
        assert authors.count("mallory") == 2
        assert "bad-agent" not in authors, "a suspended agent's record ranked again"
        for client in (reader, mallory):
            client.close()
        governor.close()
        suspect.close()


def test_records_naming_a_suspended_author_do_not_empty_a_search(
        tmp_path: Path, engram_home: Path, make_token) -> None:
    """Found by review (2026-11-30): only the best limit x 4 candidates were read, and records
    at trust 0 were dropped after; 40 well-matching ones naming a suspended agent left a search
    of limit 10 with no hits although 20 others matched."""
    with gated_stack(tmp_path, engram_home, make_token) as stack:
        address = stack.shard.address
        alice = ShardClient(address, make_token("alice", "fleet-a"))
        mallory = ShardClient(address, make_token("mallory", "fleet-a"))
        governor = GovernanceClient(stack.governance.address,
                                    make_token("gov-1", "fleet-a", ("governor",)))
        governor.set_tier("bad-agent", "suspended", reason="compromised")
        for i in range(20):
            alice.add(f"quarterly deploy window notes {i}", run_id="a")
        for i in range(40):  # match better: the query's words, more of them
            mallory.add(f"quarterly deploy window quarterly deploy window {i}", run_id="m",
                        metadata={"source_authors": '["bad-agent"]'})
        _wait_searchable(alice, "quarterly", 10)
        deadline = time.monotonic() + 20
        while (len(alice.search("quarterly deploy window", limit=60, mode="lexical")) < 20
               and time.monotonic() < deadline):
            time.sleep(0.05)
        hits = alice.search("quarterly deploy window", limit=10, mode="lexical")
        assert [hit.record.agent_id for hit in hits] == ["alice"] * 10
        for client in (alice, mallory):
            client.close()
        governor.close()


def test_a_record_naming_too_many_authors_ranks_at_zero_and_none_are_looked_up(
        tmp_path: Path, engram_home: Path, make_token, monkeypatch) -> None:
    """Found by review (2026-11-30): every name in ``source_authors`` was looked up, so 8 KiB of
    made-up names on each of 400 candidates had one search ask governance about some 467,000
    agents. A record naming more than MAX_SOURCE_AUTHORS ranks at 0, none of them asked; one
    naming as many is ranked as before."""
    asked: list[str] = []
    multipliers = GovernanceTrust.multipliers

    def counted(self: GovernanceTrust, fleet_id: str, agent_ids: Collection[str]) -> object:
        asked.extend(agent_ids)
        return multipliers(self, fleet_id, agent_ids)

    monkeypatch.setattr(GovernanceTrust, "multipliers", counted)
    many = [f"many-{i}" for i in range(MAX_SOURCE_AUTHORS + 1)]
    few = [f"few-{i}" for i in range(MAX_SOURCE_AUTHORS)]
    assert MAX_GROUP <= MAX_SOURCE_AUTHORS  # a compaction summary is always ranked
    with gated_stack(tmp_path, engram_home, make_token) as stack:
        mallory = ShardClient(stack.shard.address, make_token("mallory", "fleet-a"))
        reader = ShardClient(stack.shard.address, make_token("reader", "fleet-a"))
        mallory.add("zebra crossing notes, many sources", run_id="r1",
                    metadata={"source_authors": json.dumps(many)})
        mallory.add("zebra crossing notes, few sources", run_id="r2",
                    metadata={"source_authors": json.dumps(few)})
        _wait_searchable(reader, "zebra", 1)  # the full-text index is current at commit
        hits = reader.search("zebra crossing notes", limit=10, mode="lexical")
        assert [hit.record.content for hit in hits] == ["zebra crossing notes, few sources"]
        assert set(few) <= set(asked)
        assert not set(many) & set(asked), "the names of a record past the bound were looked up"
        for client in (reader, mallory):
            client.close()
