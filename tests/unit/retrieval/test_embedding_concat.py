"""The concatenation of encoders (the quality profile's model): names, vectors, lifecycle."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from services.shard.retrieval.embedding import HashEmbedder, TestEmbedderRefused, Vectors
from services.shard.retrieval.embedding_concat import (
    IDENTITY_MAX,
    ConcatEmbedder,
    build_embedder,
    concat_identity,
    split_embedder,
)

TEXTS = ["the deploy failed on a missing secret", "rollback the canary when p99 doubles",
         "the cache key includes the tenant", ""]


def test_split_names_and_profiles(tmp_path: Path) -> None:
    assert split_embedder("minilm", "S") == ["minilm"]
    assert split_embedder("quality", "S") == ["minilm", "mpnet"]
    assert split_embedder("minilm + /models/bge", "S") == ["minilm", "/models/bge"]
    odd = tmp_path / "bge+e5"  # a model directory whose name holds '+' is one model
    odd.mkdir()
    assert split_embedder(str(odd), "S") == [str(odd)]


@pytest.mark.parametrize(("value", "says"), [
    ("minilm+", "empty encoder name"),
    ("+mpnet", "empty encoder name"),
    ("minilm+none", "'none' cannot be part"),
    ("minilm+minilm", "named twice"),
    ("minilm+quality", "profile"),
    ("minilm+mpnet+hash+minilm-fp32", "at most 3"),
])
def test_split_refuses_bad_joins(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as raised:
        split_embedder(value, "ENGRAM_SHARD_EMBEDDER")
    assert "ENGRAM_SHARD_EMBEDDER" in str(raised.value)


def test_identity_fits_the_model_column() -> None:
    assert concat_identity(["a", "b"]) == "a+b"
    long = concat_identity(["x" * 40, "y" * 40])
    assert long.startswith("concat@") and len(long) <= IDENTITY_MAX
    assert long != concat_identity(["x" * 40, "y" * 39 + "z"])


def test_vectors_are_unit_and_their_cosine_is_the_mean_of_the_parts() -> None:
    small, large = HashEmbedder(32), HashEmbedder(96)
    joined = ConcatEmbedder([small, large])
    try:
        assert (joined.name, joined.dimension) == ("hash-32+hash-96", 128)
        assert joined.for_tests_only
        vectors = joined.embed(TEXTS[:3])
        assert vectors.shape == (3, 128) and vectors.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
        a, b = small.embed(TEXTS[:3]), large.embed(TEXTS[:3])
        expected = (a @ a.T + b @ b.T) / 2
        np.testing.assert_allclose(vectors @ vectors.T, expected, atol=1e-5)
        np.testing.assert_array_equal(joined.embed_background(TEXTS[:3]), vectors)
        assert joined.embed([]).shape == (0, 128)
        assert joined.embed_started is None  # no part runs in a process of its own
    finally:
        joined.close()


def test_a_part_without_a_vector_for_a_text_still_gives_a_unit_row() -> None:
    """Found by a review: the hash part gives a zero row for a text without a word, and the
    join's row was 0.707 long (the module promised unit rows)."""
    joined = ConcatEmbedder([HashEmbedder(32), _Part(48)])
    try:
        vectors = joined.embed(["", "!!! ???", "words here"])
        np.testing.assert_allclose(np.linalg.norm(vectors[:2], axis=1), [0.0, 0.0])
        mixed = ConcatEmbedder([HashEmbedder(32), _Unit(16)])
        try:
            np.testing.assert_allclose(np.linalg.norm(mixed.embed(["", "x y"]), axis=1), 1.0,
                                       rtol=1e-5)
        finally:
            mixed.close()
    finally:
        joined.close()


class _Unit(HashEmbedder):
    """A part that always has a vector (as a real model does)."""

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        out[:, 0] = 1.0
        return out


def test_a_single_part_is_refused() -> None:
    with pytest.raises(ValueError, match="at least two"):
        ConcatEmbedder([HashEmbedder()])


class _Part(HashEmbedder):
    """A part that records what happened to it, optionally failing."""

    for_tests_only = False

    def __init__(self, dimension: int, *, fail: str = "",
                 barrier: threading.Barrier | None = None) -> None:
        super().__init__(dimension)
        self.fail, self.barrier = fail, barrier
        self.closed = False
        self.settled = 0

    def embed(self, texts: Sequence[str]) -> Vectors:
        if self.barrier is not None:
            self.barrier.wait()
        if self.fail == "embed":
            raise RuntimeError(f"{self.name} failed")
        return super().embed(texts)

    def embed_started(self, texts: Sequence[str]) -> _Pending:
        if self.fail == "start":
            raise RuntimeError(f"{self.name} could not start")
        return _Pending(self, super().embed(texts))

    def close(self) -> None:
        self.closed = True
        if self.fail == "close":
            raise RuntimeError(f"{self.name} did not close")


class _Pending:
    def __init__(self, part: _Part, vectors: Vectors) -> None:
        self.part, self.vectors = part, vectors

    def __call__(self) -> Vectors:
        return self.vectors

    def settle(self) -> None:
        self.part.settled += 1


def test_started_queries_join_every_part_and_settle_them_all() -> None:
    first, second = _Part(16), _Part(48)
    joined = ConcatEmbedder([first, second])
    try:
        assert joined.embed_started is not None
        pending = joined.embed_started(TEXTS[:2])
        np.testing.assert_array_equal(pending(), joined.embed(TEXTS[:2]))
        joined.embed_started(TEXTS[:1]).settle()
        assert (first.settled, second.settled) == (1, 1)
    finally:
        joined.close()


def test_a_part_that_cannot_start_leaves_no_pipe_held() -> None:
    first, second = _Part(16), _Part(48, fail="start")
    joined = ConcatEmbedder([first, second])
    try:
        assert joined.embed_started is not None
        with pytest.raises(RuntimeError, match="could not start"):
            joined.embed_started(TEXTS[:1])
        assert first.settled == 1  # the part already sent to was read, its pipe freed
    finally:
        joined.close()


def test_parts_embed_at_once_and_a_failure_is_raised() -> None:
    """Both parts must be inside embed() together to pass the barrier: one after the other,
    the first waits for the second in vain and fails."""
    meeting = threading.Barrier(2, timeout=10)
    first, second = _Part(16, barrier=meeting), _Part(48, barrier=meeting)
    joined = ConcatEmbedder([first, second])
    try:
        assert joined.embed(TEXTS[:2]).shape == (2, 64)
        assert joined.embed_background(TEXTS[:2]).shape == (2, 64)
        second.fail = "embed"
        with pytest.raises(RuntimeError, match="hash-48 failed"):
            joined.embed(TEXTS[:2])
    finally:
        joined.close()


def test_close_closes_every_part_even_after_one_fails() -> None:
    first, second = _Part(16, fail="close"), _Part(48)
    joined = ConcatEmbedder([first, second])
    with pytest.raises(RuntimeError, match="did not close"):
        joined.close()
    assert first.closed and second.closed


def test_build_closes_the_parts_built_when_a_later_one_fails() -> None:
    built: list[_Part] = []

    def build_one(name: str) -> _Part:
        if name == "mpnet":
            raise FileNotFoundError("mpnet is not installed")
        built.append(_Part(16))
        return built[-1]

    with pytest.raises(FileNotFoundError):
        build_embedder("quality", "ENGRAM_SHARD_EMBEDDER", build_one)
    assert [part.closed for part in built] == [True]
    single = build_embedder("minilm", "ENGRAM_SHARD_EMBEDDER", build_one)
    assert isinstance(single, _Part)


def test_the_shard_refuses_a_test_part_and_stops_the_real_one(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    from services.shard import server
    from services.shard.settings import ShardSettings

    made: list[_Part] = []

    def encoder(settings: ShardSettings) -> _Part | HashEmbedder:
        if settings.embedder == "hash":
            return HashEmbedder()
        made.append(_Part(16))
        return made[-1]

    monkeypatch.setattr(server, "_encoder", encoder)
    with pytest.raises(TestEmbedderRefused):
        server.embedding_provider(ShardSettings(embedder="minilm+hash"))
    assert [part.closed for part in made] == [True]
    provider = server.embedding_provider(ShardSettings(embedder="minilm+hash",
                                                       allow_test_embedder=True))
    assert provider is not None and provider.name == "hash-16+hash-64"
    provider.close()


def test_the_embedding_service_loads_a_join_as_the_shard_does(tmp_path: Path) -> None:
    from services.embedder.server import load_encoder
    from services.embedder.settings import EmbedderSettings

    with pytest.raises(ValueError, match=r"ENGRAM_EMBEDDER_EMBEDDER.*named twice"):
        load_encoder(EmbedderSettings(home=tmp_path, embedder="hash+hash"))
    with pytest.raises(TestEmbedderRefused):
        load_encoder(EmbedderSettings(home=tmp_path, embedder="hash+minilm"))
    joined = load_encoder(EmbedderSettings(home=tmp_path, embedder="hash+minilm",
                                           allow_test_embedder=True, threads=1))
    try:
        assert isinstance(joined, ConcatEmbedder)
        assert (joined.name, joined.dimension) == ("hash-64+all-MiniLM-L6-v2-int8", 448)
        vectors = joined.embed(TEXTS[:2])
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    finally:
        joined.close()


def test_the_lexical_weight_setting_reaches_the_index_and_is_bounded(
        tmp_path: Path, engram_home: Path) -> None:
    from pydantic import ValidationError

    from services.shard.server import build_shard_server
    from services.shard.settings import ShardSettings

    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="lexical_weight"):
            ShardSettings(lexical_weight=bad)
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True, embedder="none", lexical_weight=0.4)
    _server, service = build_shard_server(settings)
    index = service.search_engine.index
    assert index is not None and index.context.lexical_weight == 0.4
    assert ShardSettings().hybrid_lexical_weight() == 0.5
    assert ShardSettings(embedder="quality").hybrid_lexical_weight() == 0.4
    assert ShardSettings(embedder="quality", lexical_weight=0.5).hybrid_lexical_weight() == 0.5
