"""The ONNX Runtime MiniLM against the numpy forward pass (itself checked against the
reference model in test_embedding_and_index.py)."""

from __future__ import annotations

import numpy as np
import pytest

from services.shard.retrieval.embedding import BertEmbedder, require_production
from services.shard.retrieval.embedding_onnx import OnnxBertEmbedder
from services.shard.server import embedding_provider
from services.shard.settings import ShardSettings

TEXTS = [
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "Melanie: Wow, that's cool! What made it so special?",
    "The stock market fell sharply after the central bank raised interest rates.",
    "ok",
    "Deploy the shard with two replicas behind the load balancer, then run the migrations.",
    "[shares a photo of a dog sitting on a wooden porch next to a red bicycle]",
    "Ünïcödé, emoji 🙂 and punctuation!?; all in one (short) line.",
    "a much longer sentence with quite a few more tokens in it, so that batches need padding "
    "and the attention mask has to keep the padded positions out of every layer and the mean",
]


@pytest.fixture(scope="module")
def reference() -> BertEmbedder:
    return BertEmbedder()


@pytest.fixture(scope="module")
def fp32() -> OnnxBertEmbedder:
    return OnnxBertEmbedder(threads=1)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1))


def test_fp32_graph_matches_the_numpy_forward_pass(
    fp32: OnnxBertEmbedder, reference: BertEmbedder
) -> None:
    vectors = fp32.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert _cosines(vectors, reference.embed(TEXTS)).min() >= 0.999
    assert np.allclose(vectors, reference.embed(TEXTS), atol=1e-5)
    require_production(fp32, allow_test_embedder=False)


def test_batch_and_single_give_the_same_vectors_in_input_order(fp32: OnnxBertEmbedder) -> None:
    together = fp32.embed(TEXTS)
    alone = np.vstack([fp32.embed([text]) for text in TEXTS])
    assert np.allclose(together, alone, atol=1e-5)
    reversed_order = fp32.embed(TEXTS[::-1])
    assert np.allclose(reversed_order[::-1], together, atol=1e-5)


def test_empty_input_gives_no_rows(fp32: OnnxBertEmbedder) -> None:
    assert fp32.embed([]).shape == (0, 384)


def test_long_text_is_truncated_like_the_reference(
    fp32: OnnxBertEmbedder, reference: BertEmbedder
) -> None:
    long = " ".join(f"word{i % 50} memory" for i in range(600))
    longer = long + " and a tail the model never reads"
    vectors = fp32.embed([long, longer])
    assert np.allclose(vectors[0], vectors[1], atol=1e-6)  # both cut at max_tokens
    assert _cosines(vectors[:1], reference.embed([long]))[0] >= 0.999


@pytest.fixture(scope="module")
def int8() -> OnnxBertEmbedder:
    return OnnxBertEmbedder(threads=2, int8=True)  # two threads: the striped path


def test_int8_stays_close_to_the_float_model(
    int8: OnnxBertEmbedder, fp32: OnnxBertEmbedder
) -> None:
    quantized, exact = int8.embed(TEXTS), fp32.embed(TEXTS)
    cosines = _cosines(quantized, exact)
    # ONNX Runtime's int8 kernels differ by CPU. LoCoMo's turns and questions: mean 0.993, min
    # 0.980 on a machine with VNNI; mean 0.992, min 0.971 on an AVX2-only EPYC, where these
    # eight give mean 0.989 and "ok" 0.970. What search needs holds on both: every text keeps
    # its nearest neighbour, and no pair's similarity moves by more than a few hundredths.
    assert cosines.mean() >= 0.985 and cosines.min() >= 0.96
    pairs_int8, pairs_fp32 = quantized @ quantized.T, exact @ exact.T
    np.fill_diagonal(pairs_int8, -1.0)
    np.fill_diagonal(pairs_fp32, -1.0)
    assert (pairs_int8.argmax(axis=1) == pairs_fp32.argmax(axis=1)).all()
    assert np.abs(pairs_int8 - pairs_fp32).max() < 0.05
    assert int8.name != fp32.name  # stored vectors are keyed by model: no silent mixing


def test_int8_vectors_do_not_depend_on_batch_mates_or_threads(int8: OnnxBertEmbedder) -> None:
    many = TEXTS * 3  # more batches than threads, so every stripe has work
    together = int8.embed(many)
    alone = np.vstack([int8.embed([text]) for text in TEXTS])
    assert np.array_equal(together[: len(TEXTS)], alone)
    assert np.array_equal(together[len(TEXTS) : 2 * len(TEXTS)], alone)
    assert int8.embed([]).shape == (0, 384)


def test_shard_settings_choose_the_onnx_embedder() -> None:
    provider = embedding_provider(
        ShardSettings(embedder="minilm-fp32", embed_threads=1, embed_process=False)
    )
    assert isinstance(provider, OnnxBertEmbedder) and provider.name == "all-MiniLM-L6-v2"
    with pytest.raises(ValueError, match="minilm-fp32"):
        embedding_provider(ShardSettings(embedder="minilm-numpy"))
