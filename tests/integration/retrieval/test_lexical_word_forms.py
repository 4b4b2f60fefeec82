"""README, Search: "Lexical is BM25 (Porter stemming, stop words)": a lexical search finds a
record by another form of its words, and words too common to mean anything match nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram.client import ShardClient
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory

RECORDS = {
    "runs": "She runs five miles every morning.",
    "painting": "The painting was hung in the hall.",
    "connections": "Database connections are pooled per worker.",
}


@pytest.fixture
def shard(tmp_path: Path, engram_home: Path,
          make_token: TokenFactory) -> Iterator[tuple[ShardClient, dict[str, str]]]:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True, embedder="none")
    server, _ = build_shard_server(settings)
    server.start()
    client = ShardClient(server.address, make_token("stemmer", "fleet-words"))
    try:
        ids = {key: client.add(text, run_id=f"run-{key}").record.id  # no shared neighbours
               for key, text in RECORDS.items()}
        yield client, ids
    finally:
        client.close()
        server.stop(0)


@pytest.mark.parametrize(("query", "expected"), [
    ("running", "runs"),
    ("painted", "painting"),
    ("connected", "connections"),
    ("Pooling", "connections"),
])
def test_a_lexical_search_finds_another_form_of_the_words(
        shard: tuple[ShardClient, dict[str, str]], query: str, expected: str) -> None:
    client, ids = shard
    hits = client.search(query, mode="lexical")
    assert [hit.record.id for hit in hits] == [ids[expected]], query


def test_stop_words_alone_match_nothing(shard: tuple[ShardClient, dict[str, str]]) -> None:
    client, _ = shard
    # "the", "was" and "in" are in two of the records; as terms they would rank them
    assert client.search("the was in", mode="lexical") == []
