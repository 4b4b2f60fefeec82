"""When the query cannot be embedded: hybrid ranks lexically, semantic fails UNAVAILABLE."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from services.common.db import Database
from services.common.errors import Unavailable
from services.common.tokens import Principal
from services.shard.domain.records import RecordDraft
from services.shard.retrieval.embedding import HashEmbedder, Vectors
from services.shard.retrieval.embedding_process import EmbedderUnavailable
from services.shard.search.engine import SearchQuery
from services.shard.search.index import SearchIndex
from services.shard.server import MIGRATIONS
from services.shard.service import ShardService


class _FlakyEmbedder(HashEmbedder):
    """Indexes normally; queries fail while ``down`` (as when the embedder child dies)."""

    down = False

    def embed(self, texts: Sequence[str]) -> Vectors:
        if self.down:
            raise EmbedderUnavailable("the embedder process exited (code -9)")
        return super().embed(texts)

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        return super().embed(texts)


class _FlakyStartedEmbedder(_FlakyEmbedder):
    """Like the embedder process: a query is sent first (``embed_started``) and read later;
    while ``down`` no child can start, so the sending fails."""

    settled = 0

    def embed_started(self, texts: Sequence[str]) -> Callable[[], Vectors]:
        vectors = self.embed(texts)
        embedder = self

        class Pending:
            def __call__(self) -> Vectors:
                return vectors

            def settle(self) -> None:
                embedder.settled += 1

        return Pending()


@pytest.fixture(params=[_FlakyEmbedder, _FlakyStartedEmbedder])
def shard(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[ShardService, _FlakyEmbedder]:
    database = Database(f"sqlite:///{tmp_path / 'shard.db'}")
    database.upgrade(MIGRATIONS)
    embedder: _FlakyEmbedder = request.param()
    index = SearchIndex(database, embedder)
    index.warm_up()
    service = ShardService(database, index=index)
    agent = Principal(agent_id="a", fleet_id="f", roles=frozenset({"agent"}))
    service.write(agent, [RecordDraft("the garden hose leaks at the tap"),
                          RecordDraft("quarterly revenue grew twelve percent")])
    while index.catch_up():
        pass
    return service, embedder


def _ids(service: ShardService, mode: str) -> list[str]:
    hits = service.search(SearchQuery(fleet_id="f", text="garden hose", mode=mode, limit=5))
    return [hit.record.content for hit in hits]


def test_hybrid_ranks_lexically_while_the_embedder_is_down(
    shard: tuple[ShardService, _FlakyEmbedder],
) -> None:
    service, embedder = shard
    assert _ids(service, "hybrid")[0] == "the garden hose leaks at the tap"
    embedder.down = True
    assert _ids(service, "hybrid") == ["the garden hose leaks at the tap"]
    with pytest.raises(Unavailable, match="embedder process exited") as raised:
        _ids(service, "semantic")
    assert raised.value.reason == "EMBEDDER_UNAVAILABLE"
    embedder.down = False
    assert _ids(service, "semantic")[0] == "the garden hose leaks at the tap"
    if isinstance(embedder, _FlakyStartedEmbedder):  # every started query was ended
        assert embedder.settled == 2
