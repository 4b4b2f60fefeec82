"""Duplicate memories: exact-normalised and semantic near-duplicates are not stored twice."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from engram.client import ShardClient
from engram.client.shard import record_input
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


def _serve(tmp_path: Path, engram_home: Path, token: str, dedup: str,
           **options: object) -> tuple[ShardClient, object]:
    """An ungated shard on SQLite (``options``: more settings, e.g. the hash embedder)."""
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True, dedup=dedup, **options)
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
    alice, server = _serve(tmp_path, engram_home, make_token("alice", "fleet-x"), mode,
                           embedder="hash", allow_test_embedder=True)
    bob = ShardClient(server.address, make_token("bob", "fleet-x"))  # type: ignore[attr-defined]
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


@pytest.mark.parametrize("mode", ["exact", "semantic"])
def test_a_retried_batch_answers_every_input_as_the_first_time(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory, mode: str
) -> None:
    """A batch whose inputs include duplicates (of a batch mate, of a stored record, and an
    identical repeat) replays one result per input, in order, duplicate_of included."""
    client, server = _serve(tmp_path, engram_home, make_token("a9", "fleet-r"), mode,
                            embedder="hash", allow_test_embedder=True)
    try:
        stored = client.add("The build server runs on Fridays.", run_id="r1")
        batch = [record_input(text, run_id="r1") for text in (
            "Deploy at noon", "deploy  AT noon", "A new fact about lunch.",
            "the build  server runs on FRIDAYS.", "A new fact about lunch.")]
        first = client.add_many(batch, request_id="retry-me")
        again = client.add_many(batch, request_id="retry-me")
        assert len(first.results) == len(again.results) == len(batch)
        assert ([(r.record.id, r.duplicate_of) for r in again.results]
                == [(r.record.id, r.duplicate_of) for r in first.results])
        assert first.results[1].duplicate_of == first.results[0].record.id
        assert first.results[3].duplicate_of == stored.record.id
        assert first.results[4].record.id == first.results[2].record.id
        assert not first.results[4].duplicate_of
        assert not any(r.created for r in again.results)
        assert len(list(client.list())) == 3
        # the same text again, no request id: the same record, not a duplicate of itself
        repeat = client.add("The build server runs on Fridays.", run_id="r1")
        assert repeat.record.id == stored.record.id
        assert not repeat.created and not repeat.duplicate_of
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def test_a_request_whose_records_are_partly_gone_is_written_anew(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory
) -> None:
    """A recorded request naming a record no longer stored (retention, or a row recorded before
    answers were kept by input) goes through the write again and answers every input."""
    client, server = _serve(tmp_path, engram_home, make_token("a9", "fleet-r"), "exact")
    try:
        batch = [record_input(t, run_id="r1") for t in ("Deploy at noon", "deploy  AT noon",
                                                         "Lunch is at one.")]
        first = client.add_many(batch, request_id="rq")
        with sqlite3.connect(tmp_path / "shard.db") as db:
            (recorded,) = db.execute("SELECT record_ids_json FROM write_requests").fetchone()
            ids = json.loads(recorded)
            ids[1] = "0" * 32  # as recorded before: the duplicate's own id, never stored
            db.execute("UPDATE write_requests SET record_ids_json = ?", (json.dumps(ids),))
        again = client.add_many(batch, request_id="rq")
        assert ([(r.record.id, r.duplicate_of) for r in again.results]
                == [(r.record.id, r.duplicate_of) for r in first.results])
        assert len(list(client.list())) == 2
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def test_a_replay_says_duplicate_of_as_the_first_answer_did_for_an_imported_original(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory
) -> None:
    """An imported record has no write key here: its author writing its very text again gets a
    new id, found a duplicate of it. The replay said no duplicate_of (the contents were equal);
    it now says what the first answer said (review, 2026-11-30)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    origin, first_server = _serve(tmp_path / "a", engram_home, make_token("a9", "fleet-r"),
                                  "exact")
    target, second_server = _serve(tmp_path / "b", engram_home, make_token("a9", "fleet-r"),
                                   "exact")
    admin = ShardClient(second_server.address,  # type: ignore[attr-defined]
                        make_token("op", "fleet-r", ("admin",)))
    try:
        origin.add("The build server runs on Fridays.", run_id="r1")
        assert admin.import_records(list(origin.list())).created == 1
        (imported,) = list(target.list())
        batch = [record_input("The build server runs on Fridays.", run_id="r1")]
        first = target.add_many(batch, request_id="again")
        replay = target.add_many(batch, request_id="again")
        assert first.results[0].duplicate_of == imported.id
        assert ([(r.record.id, r.duplicate_of) for r in replay.results]
                == [(r.record.id, r.duplicate_of) for r in first.results])
    finally:
        admin.close()
        first_server.stop(0)  # type: ignore[attr-defined]
        second_server.stop(0)  # type: ignore[attr-defined]


def test_a_text_written_again_is_its_own_record_beside_a_stored_near_duplicate(
    tmp_path: Path, engram_home: Path, make_token: TokenFactory
) -> None:
    """Two records of one run that dedup would have merged (stored while it was off); writing
    the first's text again answers the first record, not the other as its duplicate."""
    token = make_token("a9", "fleet-r")
    client, server = _serve(tmp_path, engram_home, token, "off")
    client.add("deploy  AT noon", run_id="r1")  # the one dedup finds first
    original = client.add("Deploy at noon", run_id="r1")
    server.stop(0)  # type: ignore[attr-defined]
    client, server = _serve(tmp_path, engram_home, token, "exact")
    try:
        again = client.add("Deploy at noon", run_id="r1")
        assert again.record.id == original.record.id
        assert not again.created and not again.duplicate_of
    finally:
        server.stop(0)  # type: ignore[attr-defined]
