"""A semantic duplicate check compares a write with records on their way into the index."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from services.shard.domain.records import RecordDraft
from services.shard.retrieval.embedding import HashEmbedder
from services.shard.search.index import SearchIndex, StoredDuplicate
from services.shard.service import ShardService
from tests.unit.retrieval.test_index_snapshot import AGENT, _store

TEXT = "The team meeting moved to Friday at 3pm in room B."
AGAIN = "the team meeting moved to friday at 3pm in room b"


def test_a_near_duplicate_of_a_record_being_embedded_is_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the embedder taking a record from the queue and its vector reaching the fleet's
    index, the record was in neither, and a near duplicate written then was stored twice (seen
    under load in CI: test_semantic_near_duplicate_is_not_stored_twice)."""
    database = _store(tmp_path / "shard.db")
    index = SearchIndex(database, HashEmbedder())
    index.warm_up()
    assert index.duplicates("f", "a", [TEXT], ["r1"], semantic=True, threshold=0.97) == [None]
    ShardService(database).write(AGENT, [RecordDraft(TEXT, run_id="r1")])
    index.sync()
    (original,) = [item[2] for item in index._pending]
    storing, release = threading.Event(), threading.Event()
    store = index.repo.replace_vectors

    def held(*args, **kwargs):  # type: ignore[no-untyped-def]
        storing.set()
        assert release.wait(30)
        return store(*args, **kwargs)

    monkeypatch.setattr(index.repo, "replace_vectors", held)
    embedding = threading.Thread(target=index.catch_up)
    embedding.start()
    try:
        assert storing.wait(30)  # taken from the queue, its vector not in the index yet
        # another run: not the same normalised text key, so only the semantic check can tell
        found = index.duplicates("f", "b", [AGAIN], ["r2"], semantic=True, threshold=0.97)
        assert isinstance(found[0], StoredDuplicate) and found[0].record_ids == (original,)
    finally:
        release.set()
        embedding.join(30)
    again = index.duplicates("f", "b", [AGAIN], ["r2"], semantic=True, threshold=0.97)
    assert isinstance(again[0], StoredDuplicate) and original in again[0].record_ids
