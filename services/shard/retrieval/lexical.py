"""An in-memory BM25 index over analysed terms, with a postings list per term.

Documents are appended (ids are dense positions); scoring accumulates each query
term's postings into one score array, so a query costs the postings it touches.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


def as_bag(terms: Iterable[str] | Mapping[str, float]) -> dict[str, float]:
    """Term -> weight; a plain sequence counts occurrences."""
    if isinstance(terms, Mapping):
        return {t: float(w) for t, w in terms.items()}
    return {t: float(c) for t, c in Counter(terms).items()}


class _Postings:
    __slots__ = ("ascending", "doc_ids", "freqs", "late", "size")

    def __init__(self) -> None:
        self.doc_ids = np.empty(8, dtype=np.int32)
        self.freqs = np.empty(8, dtype=np.float32)
        self.size = 0
        self.ascending = True
        """Every entry names a later document than the one before: no document twice."""
        self.late: list[tuple[int, float]] | None = None
        """(GrowingBM25) documents older than the last entry that gained the term, not yet
        merged in: :meth:`merge_late` puts them in place before the list is read."""

    def append(self, doc: int, freq: float) -> None:
        if self.size == len(self.doc_ids):
            self.doc_ids = np.resize(self.doc_ids, self.size * 2)
            self.freqs = np.resize(self.freqs, self.size * 2)
        if self.size and doc <= self.doc_ids[self.size - 1]:
            self.ascending = False
        self.doc_ids[self.size] = doc
        self.freqs[self.size] = freq
        self.size += 1

    def add(self, doc: int, freq: float) -> None:
        """Add ``freq`` to ``doc``'s entry, keeping one entry per document in order: a later
        document is appended, a listed one summed in place, an older unlisted one set aside."""
        size = self.size
        if not size or doc > self.doc_ids[size - 1]:
            self.append(doc, freq)
            return
        at = int(np.searchsorted(self.doc_ids[:size], doc))
        if self.doc_ids[at] == doc:
            self.freqs[at] += freq
            return
        if self.late is None:
            self.late = []
        self.late.append((doc, freq))

    def merge_late(self) -> None:
        """Put the set-aside documents in place (one pass over the list)."""
        if not self.late:
            return
        late = np.asarray(self.late, dtype=np.float64)
        self.late = None
        docs, where = np.unique(late[:, 0].astype(np.int64), return_inverse=True)
        freqs = np.bincount(where, weights=late[:, 1])
        at = np.searchsorted(self.doc_ids[: self.size], docs)
        self.doc_ids = np.insert(self.doc_ids[: self.size], at, docs.astype(np.int32))
        self.freqs = np.insert(self.freqs[: self.size], at, freqs.astype(np.float32))
        self.size = len(self.doc_ids)


_PACK_CHUNK = 8192
"""Postings lists copied by one numpy call when a snapshot packs them."""


@dataclass
class _Lists:
    """Each term's postings as they are: its length, its document array (whole) and its
    weights (the first ``size``)."""

    terms: list[str]
    sizes: list[int]
    ascending: list[bool]
    doc_ids: list[npt.NDArray[np.int32]]
    freqs: list[npt.NDArray[np.float32]]


def _cut(arrays: list[npt.NDArray[Any]], sizes: list[int]) -> list[npt.NDArray[Any]]:
    """Each array's first ``size`` entries (no slice of one sized exactly, e.g. loaded)."""
    return [a if len(a) == n else a[:n] for a, n in zip(arrays, sizes, strict=True)]


def _joined(parts: list[npt.NDArray[Any]], sizes: list[int], dtype: type) -> npt.NDArray[Any]:
    """``parts`` one after another in a new array (``sizes`` their lengths)."""
    out: npt.NDArray[Any] = np.empty(sum(sizes), dtype=dtype)
    at = 0
    for first in range(0, len(parts), _PACK_CHUNK):
        chunk = parts[first:first + _PACK_CHUNK]
        end = at + sum(sizes[first:first + _PACK_CHUNK])
        if end > at:
            np.concatenate(chunk, out=out[at:end])
        at = end
    return out


class BM25Index:
    """Okapi BM25 (k1, b) over weighted term bags."""

    def __init__(self, *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._postings: dict[str, _Postings] = {}
        self._lengths = np.empty(1024, dtype=np.float32)
        self._count = 0
        self._total_length = 0.0

    def __len__(self) -> int:
        return self._count

    def add(self, terms: Iterable[str] | Mapping[str, float]) -> int:
        """Index one document's terms (a mapping may carry fractional weights); returns its id."""
        bag = as_bag(terms)
        doc = self._count
        if doc == len(self._lengths):
            self._lengths = np.resize(self._lengths, doc * 2)
        length = float(sum(bag.values()))
        self._lengths[doc] = length
        self._total_length += length
        self._count += 1
        for term, freq in bag.items():
            postings = self._postings.get(term)
            if postings is None:
                postings = self._postings[term] = _Postings()
            postings.append(doc, float(freq))
        return doc

    def idf(self, term: str) -> float:
        postings = self._postings.get(term)
        df = postings.size if postings else 0
        return math.log(1.0 + (self._count - df + 0.5) / (df + 0.5))

    def scores(self, query: Iterable[str] | Mapping[str, float]) -> npt.NDArray[np.float32]:
        """BM25 score of every document (zeros where no term matches)."""
        out = np.zeros(self._count, dtype=np.float32)
        if not self._count:
            return out
        weights = as_bag(query)
        avg = self._total_length / self._count
        lengths = self._lengths[: self._count]
        for term, qweight in weights.items():
            postings = self._postings.get(term)
            if postings is None:
                continue
            ids = postings.doc_ids[: postings.size]
            tf = postings.freqs[: postings.size]
            norm = self.k1 * (1.0 - self.b + self.b * lengths[ids] / avg)
            out[ids] += qweight * self.idf(term) * tf * (self.k1 + 1.0) / (tf + norm)
        return out


class GrowingBM25:
    """BM25 whose documents may gain terms after they were added (a neighbour arrives later).

    Each term's postings hold one entry per document, in document order: extending a
    document sums into its entry, or appends when it is the latest, or (an older document
    gaining a term later ones already have) is set aside and merged in by the next query
    that reads the term. A query then reads each term's postings as they are, in the size
    of those postings: no sort, no pass over the whole collection per term.

    A document taken out (:meth:`drop`) leaves a hole: its number is never given again and
    it holds no term; the collection statistics (document count, average length, each
    term's document frequency) count only the documents left, as if built without it.
    """

    def __init__(self, *, k1: float = 0.9, b: float = 0.4) -> None:
        self.k1, self.b = k1, b
        self._postings: dict[str, _Postings] = {}
        self._lengths = np.zeros(1024, dtype=np.float32)
        self._count = 0  # document numbers given, holes included
        self._holes = 0
        self._total_length = 0.0

    def __len__(self) -> int:
        return self._count - self._holes

    def postings_size(self, term: str) -> int:
        """How many postings ``term`` has (0: none): the work scoring it costs."""
        postings = self._postings.get(term)
        return postings.size if postings is not None else 0

    _packed: dict[str, Any] | None = None
    """Set only on a :meth:`snapshot_copy`: the state it pickles as."""
    _unpacked_ids: tuple[list[npt.NDArray[np.int32]], list[int]] | None = None
    """(A :meth:`snapshot_copy`) each term's document array and its length then, packed into
    ``_packed`` when it is first pickled."""

    def __getstate__(self) -> dict[str, Any]:
        """Every term's postings packed into two arrays: a snapshot holds one object per term
        otherwise (a million rare terms pickle in seconds; packed, in a fraction of one)."""
        if self._packed is None:
            return self._pack(self._lists())
        if self._unpacked_ids is not None:
            arrays, sizes = self._unpacked_ids
            self._packed["doc_ids"] = _joined(_cut(arrays, sizes), sizes, np.int32)
            self._unpacked_ids = None
        return self._packed

    def snapshot_copy(self) -> GrowingBM25:
        """A private copy of this index's :meth:`__getstate__`, to pickle after the caller
        lets go of the fleet's lock: nothing done to this index afterwards (adds, extensions
        summed in place, merges, drops) changes it. It pickles (and loads) as this index
        would have; it serves nothing else.

        The weights are copied now, the document numbers packed when the copy is pickled: a
        postings list sums into its weights in place (:meth:`_Postings.add`), but never writes
        into the first ``size`` entries of its document array (an append writes past them or
        into a resized copy; a merge or a drop gives the list new arrays), so each term's
        array and its length now are its document numbers now."""
        lists = self._lists()
        copy = GrowingBM25.__new__(GrowingBM25)
        copy._packed = self._pack(lists, ids=False)
        copy._unpacked_ids = lists.doc_ids, lists.sizes
        return copy

    def _lists(self) -> _Lists:
        """One pass over the terms, merging only the lists that set documents aside."""
        lists = _Lists(list(self._postings), [], [], [], [])
        size_of, ascending_of = lists.sizes.append, lists.ascending.append
        ids_of, freqs_of = lists.doc_ids.append, lists.freqs.append
        for postings in self._postings.values():
            if postings.late:
                postings.merge_late()
            size = postings.size
            size_of(size)
            ascending_of(postings.ascending)
            ids_of(postings.doc_ids)
            weights = postings.freqs
            freqs_of(weights if len(weights) == size else weights[:size])
        return lists

    def _pack(self, lists: _Lists, *, ids: bool = True) -> dict[str, Any]:
        """The state, in new arrays (none shares memory with a postings list); the document
        numbers left out (None) unless ``ids``."""
        sizes = lists.sizes
        return {
            "k1": self.k1, "b": self.b, "count": self._count, "holes": self._holes,
            "total": self._total_length,
            "lengths": self._lengths[: self._count].copy(), "terms": lists.terms,
            "sizes": np.array(sizes, dtype=np.int64),
            "ascending": np.array(lists.ascending, dtype=bool),
            "doc_ids": _joined(_cut(lists.doc_ids, sizes), sizes, np.int32) if ids else None,
            "freqs": _joined(lists.freqs, sizes, np.float32),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.k1, self.b = state["k1"], state["b"]
        self._count, self._total_length = state["count"], state["total"]
        self._holes = state.get("holes", 0)  # none before snapshot format 4
        self._lengths = np.zeros(max(1024, 2 * self._count), dtype=np.float32)
        self._lengths[: self._count] = state["lengths"]
        doc_ids, freqs = state["doc_ids"], state["freqs"]
        ends = np.cumsum(state["sizes"]).tolist()
        starts = [0, *ends[:-1]]
        self._postings = {}
        # Each list is a view sized exactly to its entries: its next append copies it out.
        for term, start, end, ascending in zip(state["terms"], starts, ends,
                                               state["ascending"].tolist(), strict=True):
            postings = _Postings.__new__(_Postings)
            postings.doc_ids, postings.freqs = doc_ids[start:end], freqs[start:end]
            postings.size, postings.ascending, postings.late = end - start, ascending, None
            self._postings[term] = postings

    def add(self, bag: Mapping[str, float]) -> int:
        doc = self._count
        if doc == len(self._lengths):
            self._lengths = np.concatenate([self._lengths, np.zeros(doc, dtype=np.float32)])
        self._count += 1
        self.extend(doc, bag)
        return doc

    def extend(self, doc: int, bag: Mapping[str, float]) -> None:
        added = 0.0
        for term, weight in bag.items():
            postings = self._postings.get(term)
            if postings is None:
                postings = self._postings[term] = _Postings()
            postings.add(doc, float(weight))
            added += float(weight)
        self._lengths[doc] += added
        self._total_length += added

    def drop(self, docs: Collection[int], holes: Collection[int]) -> None:
        """Take ``docs`` out of every term's postings and zero their lengths; those among
        them in ``holes`` are gone for good (no longer counted), the others are about to be
        extended again (a neighbour's terms they held changed). A term no document holds any
        more leaves the vocabulary. One pass over the vocabulary (the terms a document holds
        are not kept per document)."""
        if not docs:
            return
        wanted = np.zeros(self._count, dtype=bool)
        wanted[np.fromiter(docs, dtype=np.int64)] = True
        terms = list(self._postings)
        lists = list(self._postings.values())
        for postings in lists:
            if postings.late:
                postings.merge_late()
        # Every list in one array: a pass in numpy instead of one numpy call per term.
        ends = np.cumsum(np.fromiter((p.size for p in lists), dtype=np.int64, count=len(lists)))
        flat = np.concatenate([p.doc_ids[: p.size] for p in lists] or [np.zeros(0, np.int32)])
        holding = np.unique(np.searchsorted(ends, np.flatnonzero(wanted[flat]), side="right"))
        emptied = []
        for at in holding.tolist():
            term, postings = terms[at], lists[at]
            keep = ~wanted[postings.doc_ids[: postings.size]]
            postings.doc_ids = postings.doc_ids[: postings.size][keep]
            postings.freqs = postings.freqs[: postings.size][keep]
            postings.size = len(postings.doc_ids)
            if not postings.size:
                emptied.append(term)
        for term in emptied:
            del self._postings[term]
        for doc in docs:
            self._total_length -= float(self._lengths[doc])
            self._lengths[doc] = 0.0
        self._holes += len(set(holes))
        if self._holes == self._count:  # none left: no rounding residue in the total
            self._total_length = 0.0

    def refill(self, docs: Iterable[tuple[int, Sequence[Mapping[str, float]]]]) -> None:
        """Give documents :meth:`drop` emptied (and did not make holes) their terms again:
        each with its bags in the order :meth:`extend` would have had them. Each term's list
        takes them in one merge rather than one search per document."""
        touched: dict[str, _Postings] = {}
        for doc, bags in docs:
            for bag in bags:
                added = 0.0
                for term, weight in bag.items():
                    postings = touched.get(term) or self._postings.get(term)
                    if postings is None:
                        postings = self._postings[term] = _Postings()
                    if postings.late is None:
                        postings.late = []
                    postings.late.append((doc, float(weight)))
                    touched[term] = postings
                    added += float(weight)
                self._lengths[doc] += added
                self._total_length += added
        for postings in touched.values():  # none stays aside: a later append could list it
            postings.merge_late()

    def sparse_scores(
        self, query: Mapping[str, float]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """(documents with a matching term, ascending; their BM25): work in the size of the
        query terms' postings, not of the collection."""
        n = len(self)  # documents counted (holes are not); numbers run to self._count
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        if not n:
            return empty
        avg = max(self._total_length / n, 1e-9)
        found_docs: list[npt.NDArray[np.int64]] = []
        found_scores: list[npt.NDArray[np.float32]] = []
        for term, qweight in query.items():
            postings = self._postings.get(term)
            if postings is None:
                continue
            postings.merge_late()
            ids = postings.doc_ids[: postings.size]
            freqs = postings.freqs[: postings.size]
            docs: npt.NDArray[Any]
            tf: npt.NDArray[Any]
            if postings.ascending:  # one entry per document: its postings are its counts
                docs, tf = ids, freqs
            elif postings.size * 8 < n:  # a later neighbour extended some documents
                docs, where = np.unique(ids, return_inverse=True)
                tf = np.bincount(where, weights=freqs)
            else:  # a common term: a dense pass is cheaper than sorting its postings
                tf_all = np.bincount(ids, weights=freqs, minlength=self._count)
                docs = np.flatnonzero(tf_all)
                tf = tf_all[docs]
            idf = math.log(1.0 + (n - len(docs) + 0.5) / (len(docs) + 0.5))
            norm = self.k1 * (1.0 - self.b + self.b * self._lengths[docs] / avg)
            found_docs.append(docs.astype(np.int64, copy=False))
            found_scores.append(
                (qweight * idf * tf * (self.k1 + 1.0) / (tf + norm)).astype(np.float32)
            )
        if not found_docs:
            return empty
        if len(found_docs) == 1:
            return found_docs[0], found_scores[0]
        if sum(len(d) for d in found_docs) * 8 < n:  # few matches: sorting them is cheaper
            docs, where = np.unique(np.concatenate(found_docs), return_inverse=True)
            summed = np.bincount(where, weights=np.concatenate(found_scores)).astype(np.float32)
            return docs, summed
        # Many matches (common terms): add into one dense row instead of sorting them all.
        # Each term lists a document once, and the sum runs in float64 in the same term
        # order as the sorting path's bincount, so both give the same scores.
        total = np.zeros(self._count, dtype=np.float64)
        for term_docs, term_scores in zip(found_docs, found_scores, strict=True):
            total[term_docs] += term_scores
        docs = np.flatnonzero(total)  # every match scores > 0 (idf > 0, tf > 0)
        return docs.astype(np.int64, copy=False), total[docs].astype(np.float32)
