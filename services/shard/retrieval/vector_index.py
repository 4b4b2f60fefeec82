"""Nearest-neighbour search over normalised vectors keyed by integer ids.

``ExactVectorIndex`` is a dense matrix product (exact, fine for small fleets);
``HnswVectorIndex`` wraps usearch's HNSW graph. ``TieredVectorIndex`` starts
exact and moves to HNSW once it holds ``threshold`` vectors. ``recall_against``
measures an approximate index against the exact one on sample queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]
Keys = Sequence[int] | npt.NDArray[np.int64]


class VectorIndex(Protocol):
    dimension: int

    def __len__(self) -> int: ...

    def add(self, keys: Sequence[int], vectors: Vectors) -> None: ...

    def search(self, query: Vectors, k: int) -> list[tuple[int, float]]:
        """Up to k (key, cosine similarity) pairs, most similar first."""
        ...


class ExactVectorIndex:
    """Rows of a matrix; keys are non-negative integers (a fleet's document numbers), mapped
    to rows by an array, so :meth:`vectors` is one fancy-indexing step for any number of keys."""

    def __init__(self, dimension: int, *, dtype: type[np.floating] = np.float32) -> None:
        self.dimension = dimension
        self._matrix = np.empty((1024, dimension), dtype=dtype)
        self._keys = np.empty(1024, dtype=np.int64)
        self._size = 0
        self._slots = np.full(1024, -1, dtype=np.int64)  # key -> row, -1 = not added

    def __len__(self) -> int:
        return self._size

    def add(self, keys: Sequence[int], vectors: Vectors) -> None:
        for given, vector in zip(keys, vectors, strict=True):
            key = int(given)
            if key < 0:
                raise ValueError(f"vector keys are non-negative integers, got {key}")
            if key >= len(self._slots):
                grown = np.full(max(key + 1, 2 * len(self._slots)), -1, dtype=np.int64)
                grown[: len(self._slots)] = self._slots
                self._slots = grown
            slot = int(self._slots[key])
            if slot < 0:
                if self._size == len(self._keys):
                    self._matrix = np.resize(self._matrix, (self._size * 2, self.dimension))
                    self._keys = np.resize(self._keys, self._size * 2)
                slot = self._size
                self._size += 1
                self._slots[key] = slot
                self._keys[slot] = key
            self._matrix[slot] = vector

    def remove(self, keys: Keys) -> None:
        """Drop the rows of ``keys`` (absent ones are skipped): the last row moves into each
        freed one, and the row it left is zeroed."""
        for given in keys:
            key = int(given)
            slot = int(self._slots[key]) if 0 <= key < len(self._slots) else -1
            if slot < 0:
                continue
            last = self._size - 1
            if slot != last:
                self._matrix[slot] = self._matrix[last]
                self._keys[slot] = self._keys[last]
                self._slots[self._keys[slot]] = slot
            self._matrix[last] = 0
            self._slots[key] = -1
            self._size = last

    def _rows(self, keys: Keys) -> npt.NDArray[np.floating]:
        wanted = np.asarray(keys, dtype=np.int64)
        inside = (wanted >= 0) & (wanted < len(self._slots))
        slots = np.where(inside, self._slots[np.where(inside, wanted, 0)], -1)
        if (slots < 0).any():
            raise KeyError(int(wanted[np.argmax(slots < 0)]))
        rows: npt.NDArray[np.floating] = self._matrix[slots]
        return rows

    def dots(self, keys: Keys, query: Vectors) -> Vectors:
        """The dot product of each key's stored vector with ``query`` (its cosine, both being
        normalised), in ``keys``' order.

        Float16 rows go to usearch's exact kernel (SimSIMD: half floats widened in registers),
        not through :meth:`vectors`: widening every row to float32 in numpy first was most of
        a hybrid search's scoring at 10k records (1,000 rows: 0.66 -> 0.32 ms on an AVX2
        EPYC). The kernel rounds the query to float16 too (4e-5 seen on MiniLM vectors, 5e-4
        at most)."""
        rows = self._rows(keys)
        if rows.dtype != np.float16 or not len(rows):
            out: Vectors = rows.astype(np.float32, copy=False) @ query.astype(np.float32)
            return out
        from usearch.index import search

        found = search(rows, query.astype(np.float16), len(rows), "ip", exact=True, threads=1)
        sims = np.empty(len(rows), dtype=np.float32)
        sims[found.keys.astype(np.int64)] = 1.0 - found.distances
        return sims

    def vectors(self, keys: Keys) -> Vectors:
        """The stored vectors of ``keys`` as float32 (scoring uses :meth:`dots`)."""
        out: Vectors = self._rows(keys).astype(np.float32, copy=False)
        return out

    def items(self) -> tuple[npt.NDArray[np.int64], Vectors]:
        return self._keys[: self._size], self._matrix[: self._size]

    def search(self, query: Vectors, k: int) -> list[tuple[int, float]]:
        if not self._size or k <= 0:
            return []
        sims = self._matrix[: self._size] @ query.astype(np.float32)
        k = min(k, self._size)
        part = np.argpartition(-sims, k - 1)[:k]
        best = part[np.argsort(-sims[part], kind="stable")]
        return [(int(self._keys[i]), float(sims[i])) for i in best]


_FILLER_KEY = 1 << 63
"""Keys of the filler vectors that overwrite removed ones (document numbers never reach it)."""


class HnswVectorIndex:
    def __init__(
        self,
        dimension: int,
        *,
        connectivity: int = 16,
        expansion_add: int = 64,
        expansion_search: int = 64,
        dtype: str = "f32",
    ) -> None:
        from usearch.index import Index

        self.dimension = dimension
        self._index = Index(
            ndim=dimension,
            metric="cos",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )

    def __len__(self) -> int:
        return len(self._index)

    def add(self, keys: Sequence[int], vectors: Vectors) -> None:
        if len(keys) == 0:
            return
        key_array = np.asarray(keys, dtype=np.uint64)
        present = [int(k) for k in key_array if self._index.contains(int(k))]
        if present:
            self._index.remove(present)
        self._index.add(key_array, np.asarray(vectors, dtype=np.float32))

    def remove(self, keys: Keys) -> None:
        """Take ``keys`` out of the graph, and their vectors out of its memory: usearch only
        marks a removed entry (its bytes stay in the index), so as many filler vectors are
        added at once, which take the freed slots over, and removed again (an erased record's
        vector must not survive in memory, docs/erasure.md)."""
        present = [int(k) for k in keys if self._index.contains(int(k))]
        if present:
            self._index.remove(present)
            fillers = np.arange(_FILLER_KEY, _FILLER_KEY + len(present), dtype=np.uint64)
            self._index.add(fillers, np.full((len(present), self.dimension),
                                             1.0 / np.sqrt(self.dimension), dtype=np.float32))
            self._index.remove(fillers)

    def search(self, query: Vectors, k: int) -> list[tuple[int, float]]:
        if not len(self._index) or k <= 0:
            return []
        matches = self._index.search(np.asarray(query, dtype=np.float32), k)
        return [
            (int(key), 1.0 - float(dist))
            for key, dist in zip(matches.keys, matches.distances, strict=True)
        ]


class TieredVectorIndex:
    """Exact below ``threshold`` vectors, HNSW from then on (built from the exact copy once).

    Past the threshold the HNSW graph holds bfloat16 and the copy that serves :meth:`dots`,
    :meth:`vectors` and the cosines :meth:`search` returns (the candidates' cosines, one
    kernel call over their rows instead of one HNSW lookup per key) float16: each half the
    memory of float32; float16 cosines are within 5e-4 of float32. bfloat16 in the graph,
    which only chooses the keys, because a CPU without half-float arithmetic widens it with a
    shift: at 10k MiniLM vectors of the bench's records, 100 nearest took 0.80 ms against
    1.21 ms in float16 (AVX2 EPYC), recall@100 against exact 0.839 in both.
    """

    def __init__(self, dimension: int, *, threshold: int = 10_000) -> None:
        self.dimension = dimension
        self.threshold = threshold
        self._exact: ExactVectorIndex | None = ExactVectorIndex(dimension)
        self._hnsw: HnswVectorIndex | None = None
        self._store: ExactVectorIndex | None = None  # float16 rows once HNSW serves search

    @property
    def approximate(self) -> bool:
        return self._hnsw is not None

    def __len__(self) -> int:
        return len(self._hnsw) if self._hnsw is not None else len(self._exact or ())

    def add(self, keys: Sequence[int], vectors: Vectors) -> None:
        if self._hnsw is not None and self._store is not None:
            self._hnsw.add(keys, vectors)
            self._store.add(keys, vectors)
            return
        assert self._exact is not None
        self._exact.add(keys, vectors)
        if len(self._exact) >= self.threshold:
            hnsw = HnswVectorIndex(self.dimension, dtype="bf16")
            store = ExactVectorIndex(self.dimension, dtype=np.float16)
            all_keys, all_vectors = self._exact.items()
            key_list = [int(k) for k in all_keys]
            hnsw.add(key_list, all_vectors)
            store.add(key_list, all_vectors)
            self._hnsw, self._store, self._exact = hnsw, store, None

    def remove(self, keys: Keys) -> None:
        """Drop the vectors of ``keys`` (absent ones are skipped). Once removals (erasures)
        take an HNSW-served index below half its threshold, it is exact again: a graph whose
        removed nodes stay in it as filler serves a fleet that small worse than a scan. Half,
        not the threshold itself, so a fleet near it does not rebuild its graph back and forth
        as records are erased and written."""
        for index in (self._hnsw, self._store, self._exact):
            if index is not None:
                index.remove(keys)
        if self._store is not None and len(self._store) < self.threshold // 2:
            exact = ExactVectorIndex(self.dimension)
            kept_keys, kept_vectors = self._store.items()
            exact.add([int(k) for k in kept_keys], kept_vectors.astype(np.float32))
            self._exact, self._hnsw, self._store = exact, None, None

    def vectors(self, keys: Keys) -> Vectors:
        """The stored vectors of ``keys`` (each must have been added; KeyError otherwise)."""
        return self._source().vectors(keys)

    def dots(self, keys: Keys, query: Vectors) -> Vectors:
        """Each key's cosine to ``query`` (normalised), as :meth:`ExactVectorIndex.dots`."""
        return self._source().dots(keys, query)

    def _source(self) -> ExactVectorIndex:
        source = self._store if self._store is not None else self._exact
        assert source is not None
        return source

    def search(self, query: Vectors, k: int) -> list[tuple[int, float]]:
        if self._hnsw is not None and self._store is not None:
            # The graph finds the keys; their cosines come from the float16 copy, since a
            # bfloat16 cosine is 8x coarser and callers compare them with thresholds
            # (semantic dedup at 0.97, the seeds' min_similarity).
            keys = [key for key, _ in self._hnsw.search(query, k)]
            if not keys:
                return []
            sims = self._store.dots(keys, query)
            order = np.argsort(-sims, kind="stable")
            return [(keys[i], float(sims[i])) for i in order]
        assert self._exact is not None
        return self._exact.search(query, k)


def recall_against(exact: VectorIndex, approximate: VectorIndex, queries: Vectors, k: int) -> float:
    """Mean share of the exact top-k keys that the approximate index also returns."""
    if len(queries) == 0:
        return 1.0
    total = 0.0
    for query in queries:
        truth = {key for key, _ in exact.search(query, k)}
        found = {key for key, _ in approximate.search(query, k)}
        total += len(truth & found) / max(1, len(truth))
    return total / len(queries)
