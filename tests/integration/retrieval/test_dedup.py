"""Duplicate memories: exact-normalised and semantic near-duplicates are not stored twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engram.client import ShardClient
from engram.client.shard import record_input
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


def _serve(tmp_path: Path, engram_home: Path, token: str,
           dedup: str) -> tuple[ShardClient, object]:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True, dedup=dedup)
    server, _ = build_shard_server(settings)
    server.start()
    return ShardClient(server.address, token), server


def test_exact_normalised_duplicate_returns_the_stored_record(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory
) -> None:
    client, server = _serve(tmp_path, engram_home, make_token("a1", "fleet-d"), "exact")
    try:
        first = client.add("Alice prefers green tea in the morning.", run_id="r1")
        again = client.add("alice prefers  GREEN tea in the morning.", run_id="r1")
        assert first.created and not again.created
        assert again.duplicate_of == first.record.id
        assert again.record.id == first.record.id
        # another run keeps its own copy: a run's snapshot holds exactly what it wrote
        elsewhere = client.add("Alice prefers green tea in the morning.", run_id="r2")
        assert elsewhere.created and not elsewhere.duplicate_of
        assert [r.id for r in client.snapshot("r2")] == [elsewhere.record.id]
        # signs and punctuation can change a fact: not duplicates
        plus = client.add("balance is 5 USD", run_id="r1")
        minus = client.add("balance is -5 USD", run_id="r1")
        assert plus.created and minus.created and not minus.duplicate_of
        other = client.add("Alice prefers black coffee in the morning.", run_id="r1")
        assert other.created and not other.duplicate_of
        batch = client.add_many([record_input("Deploy at noon"), record_input("deploy  AT noon")])
        assert batch.results[0].created and not batch.results[1].created
        assert batch.results[1].duplicate_of == batch.results[0].record.id
        assert batch.results[1].record.record_hash == batch.results[0].record.record_hash != ""
        assert len(list(client.list())) == 6
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def test_semantic_near_duplicate_is_not_stored_twice(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory
) -> None:
    client, server = _serve(tmp_path, engram_home, make_token("a2", "fleet-s"), "semantic")
    try:
        first = client.add("The team meeting moved to Friday at 3pm in room B.")
        client.add("Quarterly revenue grew by twelve percent.")
        near = client.add("The team meeting moved to Friday at 3 pm, room B.")
        assert not near.created and near.duplicate_of == first.record.id
        distinct = client.add("The team meeting moved to Monday at 9am in room C.")
        assert distinct.created
    finally:
        server.stop(0)  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["exact", "semantic"])
def test_one_authors_write_is_never_answered_with_anothers_record(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory, mode: str
) -> None:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True, dedup=mode, embedder="hash",
                             allow_test_embedder=True)
    server, _ = build_shard_server(settings)
    server.start()
    alice = ShardClient(server.address, make_token("alice", "fleet-x"))
    bob = ShardClient(server.address, make_token("bob", "fleet-x"))
    try:
        text = "The staging database restarts every Sunday at 04:00."
        first = alice.add(text, run_id="r1")
        theirs = bob.add(text, run_id="r1")
        assert theirs.created and not theirs.duplicate_of
        assert theirs.record.agent_id == "bob" and theirs.record.id != first.record.id
        again = bob.add(text.upper(), run_id="r1")  # bob's own duplicate is still caught
        assert not again.created and again.duplicate_of == theirs.record.id
    finally:
        alice.close()
        bob.close()
        server.stop(0)


def test_dedup_is_exact_unless_the_environment_says_off(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: `ENGRAM_SHARD_DEDUP=off|exact|semantic` (default exact). Read from the
    environment as a start reads it; off stores the same text twice."""
    for name in [k for k in os.environ if k.startswith("ENGRAM_SHARD_")]:
        monkeypatch.delenv(name)
    token = make_token("a3", "fleet-o")
    for setting, stored_twice in ((None, False), ("off", True), ("exact", False)):
        if setting is None:
            monkeypatch.delenv("ENGRAM_SHARD_DEDUP", raising=False)
        else:
            monkeypatch.setenv("ENGRAM_SHARD_DEDUP", setting)
        settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / f'{setting}.db'}",
                                 port=0, allow_ungated=True, embedder="none")
        server, _ = build_shard_server(settings)
        server.start()
        client = ShardClient(server.address, token)
        try:
            first = client.add("Rotate the API keys on Monday.", run_id="r1")
            again = client.add("rotate the  API keys on monday.", run_id="r1")
            assert first.created
            assert again.created is stored_twice, setting
            assert (again.duplicate_of == "") is stored_twice, setting
            assert len(list(client.list())) == (2 if stored_twice else 1), setting
        finally:
            client.close()
            server.stop(0)
