"""When the query cannot be embedded: hybrid ranks lexically, semantic fails UNAVAILABLE;
the shard's /metrics counts the fallbacks and the indexing batches put back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common.db import Database
from services.common.errors import Unavailable
from services.common.tokens import Principal
from services.shard.domain.records import RecordDraft
from services.shard.metrics import ShardMetrics
from services.shard.retrieval.embedding import HashEmbedder, Vectors
from services.shard.retrieval.embedding_process import EmbedderUnavailable
from services.shard.search.engine import SearchQuery
from services.shard.search.index import SearchIndex
from services.shard.server import MIGRATIONS
from services.shard.service import ShardService


class _FlakyEmbedder(HashEmbedder):
    """Queries fail while ``down`` (as when the embedder child dies), indexing batches while
    ``indexing_down``."""

    down = False
    indexing_down = False

    def embed(self, texts: Sequence[str]) -> Vectors:
        if self.down:
            raise EmbedderUnavailable("the embedder process exited (code -9)")
        return super().embed(texts)

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        if self.indexing_down:
            raise EmbedderUnavailable("the embedder process exited (code -9)")
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


def _failures(registry: CollectorRegistry) -> dict[str, float]:
    """engram_shard_embedder_failures_total by stage, from the exposition a scrape reads."""
    text = generate_latest(registry).decode()
    return {sample.labels["stage"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "engram_shard_embedder_failures_total"}


def test_metrics_count_the_failures_nobody_is_told_of(
    shard: tuple[ShardService, _FlakyEmbedder],
) -> None:
    service, embedder = shard
    index = service.search_engine.index
    assert index is not None
    registry = CollectorRegistry()
    registry.register(ShardMetrics(service, index))
    assert _failures(registry) == {"query": 0.0, "index": 0.0}  # a rate sees the first one

    embedder.down = True
    assert _ids(service, "hybrid") == ["the garden hose leaks at the tap"]  # lexically
    assert _failures(registry) == {"query": 1.0, "index": 0.0}
    with pytest.raises(Unavailable):  # answered UNAVAILABLE (engram_rpc_errors_total)
        _ids(service, "semantic")
    assert _failures(registry) == {"query": 1.0, "index": 0.0}
    embedder.down = False
    _ids(service, "hybrid")
    assert _failures(registry) == {"query": 1.0, "index": 0.0}

    agent = Principal(agent_id="a", fleet_id="f", roles=frozenset({"agent"}))
    service.write(agent, [RecordDraft("the shed door sticks in winter")])
    embedder.indexing_down = True
    for _ in range(2):  # each round puts its batch back
        with pytest.raises(EmbedderUnavailable):
            index.catch_up()
    assert index.lag() == 1
    assert _failures(registry) == {"query": 1.0, "index": 2.0}
    embedder.indexing_down = False
    assert index.catch_up() == 1 and index.lag() == 0
    assert _failures(registry) == {"query": 1.0, "index": 2.0}
