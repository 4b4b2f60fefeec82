"""Several encoders as one: the quality profile (``ENGRAM_SHARD_EMBEDDER=quality``, that is
``minilm+mpnet``; docs/retrieval.md, "The quality profile").

A text's vector is the concatenation of every part's L2-normalised vector, normalised again
(each part weighs ``1/sqrt(parts)``): its cosine with another such vector is the mean of the
parts' cosines. Documents and queries are embedded the same way (by every
part), so the vector index, the stored vectors, the semantic duplicate check and a
re-embedding need nothing new: the concatenation is one model to them, with its own identity
(the parts' names joined by ``+``), so vectors of the profile are never mixed with vectors of
one of its parts.

The parts embed a batch at the same time, each in its own thread (a part in a child process
or on ONNX Runtime releases the interpreter lock while it works), so a query costs its
slowest part, not the sum.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from services.shard.retrieval.embedding import EmbeddingProvider, Vectors

IDENTITY_MAX = 64
"""The stored vectors' ``model`` column holds at most 64 characters."""

PROFILES = {"quality": "minilm+mpnet"}
"""Names that stand for a concatenation."""

MAX_PARTS = 3


def split_embedder(value: str, setting: str) -> list[str]:
    """The encoder names a setting joins with ``+`` (``quality`` stands for
    ``minilm+mpnet``); one name for a plain setting. A directory path that holds ``+`` can
    only be used alone. Refuses an empty part, ``none``, a part named twice and more than
    :data:`MAX_PARTS` parts, naming ``setting``."""
    value = PROFILES.get(value, value)
    if "+" not in value or Path(value).is_dir():
        return [value]
    parts = [part.strip() for part in value.split("+")]
    if any(not part for part in parts):
        raise ValueError(f"{setting}={value!r}: an empty encoder name between '+' signs")
    if "none" in parts:
        raise ValueError(f"{setting}={value!r}: 'none' cannot be part of a concatenation")
    if any(part in PROFILES for part in parts):
        raise ValueError(f"{setting}={value!r}: a profile ({', '.join(PROFILES)}) cannot be "
                         "part of a concatenation")
    if len(set(parts)) != len(parts):
        raise ValueError(f"{setting}={value!r}: an encoder is named twice")
    if len(parts) > MAX_PARTS:
        raise ValueError(f"{setting}={value!r}: at most {MAX_PARTS} encoders can be joined")
    return parts


def concat_identity(names: Sequence[str]) -> str:
    """The parts' names joined by ``+``, or, when that is longer than the stored vectors'
    model column holds, ``concat@`` and 24 hex digits of its SHA-256."""
    joined = "+".join(names)
    if len(joined) <= IDENTITY_MAX:
        return joined
    return "concat@" + hashlib.sha256(joined.encode()).hexdigest()[:24]


class ConcatEmbedder:
    """The parts' vectors side by side (see the module docstring)."""

    def __init__(self, parts: Sequence[EmbeddingProvider]) -> None:
        if len(parts) < 2:
            raise ValueError("a concatenation needs at least two encoders")
        self.parts = tuple(parts)
        self.name: str = concat_identity([p.name for p in self.parts])
        self.dimension: int = sum(p.dimension for p in self.parts)
        self.for_tests_only: bool = any(p.for_tests_only for p in self.parts)
        # One thread a part for the foreground (queries, the dedup check) and one a part for
        # the indexer's batches: a query never waits behind a batch in a pool.
        self._foreground = ThreadPoolExecutor(len(self.parts), "concat-embed")
        self._background = ThreadPoolExecutor(len(self.parts), "concat-embed-bg")
        # ``embed_started`` when every part has it (each part in its own process): a search
        # sends its query to every part from its own thread at once (SearchIndex looks for it).
        self._starters = [getattr(p, "embed_started", None) for p in self.parts]
        self.embed_started: Callable[[Sequence[str]], PendingConcat] | None = (
            self._embed_started if all(self._starters) else None)

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self._join(self._each(self._foreground, [p.embed for p in self.parts], texts),
                          len(texts))

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        return self._join(self._each(self._background,
                                     [p.embed_background for p in self.parts], texts),
                          len(texts))

    def _embed_started(self, texts: Sequence[str]) -> PendingConcat:
        pending: list[object] = []
        try:
            for starter in self._starters:
                assert starter is not None
                pending.append(starter(texts))
        except BaseException:
            for started in pending:
                started.settle()  # type: ignore[attr-defined]
            raise
        return PendingConcat(self, pending, len(texts))

    def _each(self, pool: ThreadPoolExecutor, calls: Sequence[Callable[[Sequence[str]], Vectors]],
              texts: Sequence[str]) -> list[Vectors]:
        if not texts:
            return [np.zeros((0, p.dimension), dtype=np.float32) for p in self.parts]
        futures = [pool.submit(call, texts) for call in calls]
        # Every part's result is waited for (none left running) before an error is raised.
        errors = [future.exception() for future in futures]
        for error in errors:
            if error is not None:
                raise error
        return [future.result() for future in futures]

    def _join(self, rows: Sequence[Vectors], count: int) -> Vectors:
        for part, block in zip(self.parts, rows, strict=True):
            if block.shape != (count, part.dimension):
                raise RuntimeError(f"encoder {part.name} returned vectors of shape "
                                   f"{block.shape}, expected ({count}, {part.dimension})")
        joined: Vectors = np.concatenate(rows, axis=1).astype(np.float32, copy=False)
        # Each part's rows are unit length, so this is their norm whole; but a part may give a
        # zero row (the hash encoder for a text without a word), and the join is then
        # normalised by what it has.
        norms = np.linalg.norm(joined, axis=1, keepdims=True)
        np.divide(joined, norms, out=joined, where=norms > 0)
        return joined

    def close(self) -> None:
        self._foreground.shutdown(wait=True)
        self._background.shutdown(wait=True)
        errors: list[BaseException] = []
        for part in self.parts:  # every part is closed, even after one failed to
            try:
                part.close()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]


class PendingConcat:
    """A query sent to every part (:meth:`ConcatEmbedder._embed_started`): called, the joined
    vectors; :meth:`settle` frees every part's pipe when nobody asks."""

    def __init__(self, owner: ConcatEmbedder, pending: list[object], count: int) -> None:
        self._owner, self._pending, self._count = owner, pending, count

    def __call__(self) -> Vectors:
        rows: list[Vectors] = []
        error: BaseException | None = None
        for started in self._pending:  # every part read, so every pipe is freed
            try:
                rows.append(started())  # type: ignore[operator]
            except BaseException as failure:
                error = error or failure
        if error is not None:
            raise error
        return self._owner._join(rows, self._count)

    def settle(self) -> None:
        for started in self._pending:
            started.settle()  # type: ignore[attr-defined]


def build_embedder(value: str, setting: str,
                   build_one: Callable[[str], EmbeddingProvider]) -> EmbeddingProvider:
    """The provider ``value`` names: ``build_one(value)``, or, for names joined by ``+`` (or a
    profile), a :class:`ConcatEmbedder` of ``build_one`` of each (the parts built so far are
    closed when one fails to build)."""
    names = split_embedder(value, setting)
    if len(names) == 1:
        return build_one(names[0])
    built: list[EmbeddingProvider] = []
    try:
        for name in names:
            built.append(build_one(name))
    except BaseException:
        for part in built:
            part.close()
        raise
    return ConcatEmbedder(built)
