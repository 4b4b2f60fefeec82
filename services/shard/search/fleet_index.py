"""FleetIndex: one fleet's in-memory retrieval state for hybrid search (no I/O).

Records are documents numbered in ``seq`` order. A record's *neighbours* are the
records written just before and after it in the same run (creation order within
``run_id``; records without a run have none): in agent memory a run is one
conversation or task, and a turn is often only understandable with the turns
around it. The craft measured on LoCoMo (docs/retrieval.md) is applied as a
general method:

- lexical: BM25 (k1 0.9, b 0.4 for short texts) over stemmed, stop-worded terms,
  each document holding its own terms plus its neighbours': the record before it
  at 0.6 (a turn replies to it), the record after it at 0.4 (an answer follows its
  question), half that two records away; a later neighbour extends an earlier
  document (:class:`GrowingBM25`);
- dense: MiniLM cosine blended with the neighbours' mean cosine (0.7 / 0.3);
- fusion: weighted sum of the two normalised scores (lexical 0.5);
- smoothing: a candidate gains 0.2 x its best neighbour's fused score;
- dates: when the query names a date ("on 13 October, 2023", "in June", "in 2023"),
  records of a matching date gain 0.3 x the best score, unless all or none match. A
  record's date is the first metadata value that reads as a full date (an event's
  date, e.g. a session date), else its creation day;
- priors (hybrid): on the scale of the best candidate, a record that is not a question
  gains 0.1 (a question asks, the answer informs) and every record 0.02 x log(1 + its
  words) (a longer record says more; BM25's length normalisation favours short ones).

Filters (author, tags, metadata key = value, created time, importance, run, domain)
apply before ranking: :meth:`FleetIndex.mask` builds the candidate set from per-document
arrays and inverted maps, then only those documents are scored (BM25 over them; cosine
exactly over their rows when they are few, else the vector index widened and post-filtered).

Only records with a lexical match (own or neighbours' terms) or a cosine above
``min_similarity`` are candidates, so an unrelated query returns nothing.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import numpy as np
import numpy.typing as npt

from services.shard.retrieval.lexical import GrowingBM25
from services.shard.retrieval.text import (
    STOP_WORDS,
    DateMention,
    analyze_tokens,
    date_mentions,
    tokenize,
)
from services.shard.retrieval.vector_index import ExactVectorIndex, TieredVectorIndex

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]

EXACT_FILTERED = 8192
"""A filter matching at most this many vectors is searched exactly over their rows."""


@dataclass(frozen=True)
class DocFacts:
    """What a filter can ask of a record, kept per document."""

    agent_id: str = ""
    domain: str = ""
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_us: int = 0
    importance: float = 0.5


@dataclass(frozen=True)
class DocFilter:
    """Conditions on documents, all of which must hold (see RecordFilter)."""

    run_id: str | None = None
    domain: str = ""
    agent_id: str = ""
    tags_all: tuple[str, ...] = ()
    tags_any: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    created_after_us: int | None = None
    created_before_us: int | None = None
    min_importance: float | None = None


@dataclass(frozen=True)
class ContextSettings:
    """Defaults: the best general setting measured on LoCoMo (docs/retrieval.md)."""

    before_weight: float = 0.6  # the previous record's terms in a record's document
    after_weight: float = 0.4  # the next record's terms (an answer follows its question)
    distance_decay: float = 0.5  # weight factor per further step within the window
    window: int = 2
    dense_neighbour_weight: float = 0.3
    lexical_weight: float = 0.5
    smoothing: float = 0.2
    date_boost: float = 0.3  # share of the best score added to records of a date the query names
    statement_prior: float = 0.1  # hybrid: a record that is not a question gains this (of the best)
    length_prior: float = 0.02  # hybrid: x log(1 + words): a longer record says more
    bm25_k1: float = 0.9
    bm25_b: float = 0.4
    depth: int = 100
    min_similarity: float = 0.25
    max_open_runs: int = 65_536  # runs whose last terms are kept to extend (LRU)


def metadata_day(metadata: Mapping[str, str], created_us: int | None = None) -> date | None:
    """A record's date: the first metadata value naming a full date (when what it records
    happened, e.g. a session date), else the day it was created (UTC)."""
    for value in metadata.values():
        for mention in date_mentions(str(value)):
            if mention.year and mention.month and mention.day:
                try:
                    return date(mention.year, mention.month, mention.day)
                except ValueError:  # "31 February": not a date
                    continue
    if created_us is None:
        return None
    return datetime.fromtimestamp(created_us / 1_000_000, tz=UTC).date()


def terms_of(text: str) -> dict[str, float]:
    return _term_counts(tokenize(text))


def _term_counts(tokens: list[str]) -> dict[str, float]:
    return {t: float(c) for t, c in Counter(analyze_tokens(tokens, stop_words=STOP_WORDS)).items()}


_VECTOR_STATE = ("vectors", "_has_vector", "previous", "_has_previous")
"""Not in a snapshot: vectors are stored in the database."""


class FleetIndex:
    """Not thread-safe: the owner (:class:`SemanticIndex`) serialises access."""

    def __init__(
        self, dimension: int, settings: ContextSettings, *, hnsw_threshold: int = 10_000
    ) -> None:
        self.settings = settings
        self.ids: list[str] = []
        self.doc_of: dict[str, int] = {}
        self.lexical = GrowingBM25(k1=settings.bm25_k1, b=settings.bm25_b)
        self.vectors = TieredVectorIndex(dimension, threshold=hnsw_threshold)
        self._has_vector = np.zeros(1024, dtype=bool)
        self._prev = np.full(1024, -1, dtype=np.int64)
        self._next = np.full(1024, -1, dtype=np.int64)
        self._run_of = np.full(1024, -1, dtype=np.int64)
        self._dates = np.zeros((1024, 3), dtype=np.int16)  # year, month, day; 0 = unknown
        self._prior = np.zeros(1024, dtype=np.float32)  # statement and length priors
        self._run_numbers: dict[str, int] = {}
        self._run_tail: OrderedDict[str, list[tuple[int, dict[str, float]]]] = OrderedDict()
        self._last_of_run: dict[str, int] = {}
        self.text_keys: dict[bytes, str] = {}  # hash of normalised text -> first record id
        self._agent_of = np.full(1024, -1, dtype=np.int32)
        self._domain_of = np.full(1024, -1, dtype=np.int32)
        self._created = np.zeros(1024, dtype=np.int64)
        self._importance = np.zeros(1024, dtype=np.float32)
        self._agent_numbers: dict[str, int] = {}
        self._domain_numbers: dict[str, int] = {}
        self._by_tag: dict[str, list[int]] = {}
        self._by_metadata: dict[tuple[str, str], list[int]] = {}
        self.drop_previous()

    def __len__(self) -> int:
        return len(self.ids)

    def __getstate__(self) -> dict[str, object]:
        """Everything but the vectors (an index snapshot: vectors are stored in the database)."""
        return {k: v for k, v in self.__dict__.items() if k not in _VECTOR_STATE}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.reset_vectors(0, 10_000)

    def reset_vectors(self, dimension: int, hnsw_threshold: int) -> None:
        """An empty vector index (after loading a snapshot: vectors come from the database)."""
        self.vectors = TieredVectorIndex(dimension, threshold=hnsw_threshold)
        self._has_vector = np.zeros(len(self._prev), dtype=bool)
        self.drop_previous()

    def drop_previous(self) -> None:
        """No vectors of a previous model (a re-embedding ended, or none is going on)."""
        # Exact rows, no graph: they are only ever scanned, and shrink in use as the
        # re-embedding goes (building an HNSW graph over them cost minutes at 200k).
        self.previous: ExactVectorIndex | None = None
        self._has_previous = np.zeros(0, dtype=bool)

    # -- growing ------------------------------------------------------------

    def add(
        self,
        record_id: str,
        run_id: str,
        text: str,
        text_key: bytes = b"",
        day: date | None = None,
        facts: DocFacts | None = None,
    ) -> int:
        """Add one record (in ``seq`` order, ``day`` its date if known); returns its number."""
        if record_id in self.doc_of:
            return self.doc_of[record_id]
        if text_key:
            self.text_keys.setdefault(text_key, record_id)
        tokens = tokenize(text)
        own = _term_counts(tokens)
        doc = len(self.ids)
        self._grow(doc + 1)
        self._add_facts(doc, facts or DocFacts())
        if day is not None:
            self._dates[doc] = (day.year, day.month, day.day)
        cfg = self.settings
        self._prior[doc] = cfg.length_prior * np.log1p(len(tokens)) + (
            0.0 if _asks(text) else cfg.statement_prior
        )
        bag = dict(own)
        tail = self._tail(run_id) if run_id else []
        steps = [cfg.distance_decay ** (len(tail) - 1 - i) for i in range(len(tail))]
        for step, (_, earlier) in zip(steps, tail, strict=True):
            for term, count in earlier.items():
                bag[term] = bag.get(term, 0.0) + step * cfg.before_weight * count
        # The earlier records first (oldest first), then this one: postings then grow in
        # document order, and most extensions append or sum in place.
        for step, (earlier_doc, _) in zip(steps, tail, strict=True):
            weight = step * cfg.after_weight
            self.lexical.extend(earlier_doc, {t: weight * c for t, c in own.items()})
        self.lexical.add(bag)
        if run_id:
            last = self._last_of_run.get(run_id)
            if last is not None:
                self._prev[doc], self._next[last] = last, doc
            self._last_of_run[run_id] = doc
            tail.append((doc, own))
            self._run_tail[run_id] = tail[-cfg.window :]
            self._run_tail.move_to_end(run_id)
            while len(self._run_tail) > cfg.max_open_runs:
                self._run_tail.popitem(last=False)  # an old run's next record skips term sharing
        self._run_of[doc] = self._run_numbers.setdefault(run_id, len(self._run_numbers))
        self.ids.append(record_id)
        self.doc_of[record_id] = doc
        return doc

    def _add_facts(self, doc: int, facts: DocFacts) -> None:
        self._agent_of[doc] = self._agent_numbers.setdefault(facts.agent_id,
                                                             len(self._agent_numbers))
        self._domain_of[doc] = self._domain_numbers.setdefault(facts.domain,
                                                               len(self._domain_numbers))
        self._created[doc] = facts.created_us
        self._importance[doc] = facts.importance
        for tag in set(facts.tags):
            self._by_tag.setdefault(tag, []).append(doc)
        for pair in facts.metadata.items():
            self._by_metadata.setdefault(pair, []).append(doc)

    def mask(self, flt: DocFilter) -> Mask | None:
        """The documents matching every condition of ``flt`` (None: it has none)."""
        n = len(self.ids)
        mask: Mask | None = None

        def narrow(more: Mask) -> None:
            nonlocal mask
            mask = more if mask is None else mask & more

        if flt.run_id is not None:
            narrow(self.run_mask(flt.run_id))
        if flt.domain:
            narrow(self._domain_of[:n] == self._domain_numbers.get(flt.domain, -2))
        if flt.agent_id:
            narrow(self._agent_of[:n] == self._agent_numbers.get(flt.agent_id, -2))
        for tag in flt.tags_all:
            narrow(self._docs(self._by_tag.get(tag, ()), n))
        if flt.tags_any:
            docs = [d for tag in flt.tags_any for d in self._by_tag.get(tag, ())]
            narrow(self._docs(docs, n))
        for pair in flt.metadata:
            narrow(self._docs(self._by_metadata.get(pair, ()), n))
        if flt.created_after_us is not None:
            narrow(self._created[:n] > flt.created_after_us)
        if flt.created_before_us is not None:
            narrow(self._created[:n] < flt.created_before_us)
        if flt.min_importance is not None:
            # float32 holds importance: compare at that precision so 0.3 >= 0.3 stays true
            narrow(self._importance[:n] >= np.float32(flt.min_importance))
        return mask

    @staticmethod
    def _docs(docs: list[int] | tuple[()], n: int) -> Mask:
        out = np.zeros(n, dtype=bool)
        if docs:
            out[np.asarray(docs, dtype=np.int64)] = True
        return out

    def _tail(self, run_id: str) -> list[tuple[int, dict[str, float]]]:
        return list(self._run_tail.get(run_id, []))

    def _grow(self, size: int) -> None:
        if size <= len(self._prev):
            return
        extra = len(self._prev)
        self._prev = np.concatenate([self._prev, np.full(extra, -1, dtype=np.int64)])
        self._next = np.concatenate([self._next, np.full(extra, -1, dtype=np.int64)])
        self._has_vector = np.concatenate([self._has_vector, np.zeros(extra, dtype=bool)])
        self._run_of = np.concatenate([self._run_of, np.full(extra, -1, dtype=np.int64)])
        self._dates = np.concatenate([self._dates, np.zeros((extra, 3), dtype=np.int16)])
        self._prior = np.concatenate([self._prior, np.zeros(extra, dtype=np.float32)])
        self._agent_of = np.concatenate([self._agent_of, np.full(extra, -1, dtype=np.int32)])
        self._domain_of = np.concatenate([self._domain_of, np.full(extra, -1, dtype=np.int32)])
        self._created = np.concatenate([self._created, np.zeros(extra, dtype=np.int64)])
        self._importance = np.concatenate([self._importance, np.zeros(extra, dtype=np.float32)])

    def add_vectors(self, docs: list[int], vectors: Floats) -> None:
        fresh = [i for i, d in enumerate(docs) if not self._has_vector[d]]
        if not fresh:
            return
        self.vectors.add([docs[i] for i in fresh], vectors[fresh])
        self._has_vector[[docs[i] for i in fresh]] = True

    def add_previous_vectors(self, docs: list[int], vectors: Floats) -> None:
        """Vectors of the model being replaced, served for the documents the new model has
        not embedded yet (``previous_vector`` in :meth:`search`); never compared with the
        new model's query."""
        if self.previous is None:
            self.previous = ExactVectorIndex(vectors.shape[1])
        if len(self._has_previous) < len(self._prev):
            grown = np.zeros(len(self._prev), dtype=bool)
            grown[: len(self._has_previous)] = self._has_previous
            self._has_previous = grown
        fresh = [i for i, d in enumerate(docs) if not self._has_previous[d]]
        if fresh:
            self.previous.add([docs[i] for i in fresh], vectors[fresh])
            self._has_previous[[docs[i] for i in fresh]] = True

    def _only_previous(self, n: int) -> npt.NDArray[np.bool_]:
        """Documents with a previous model's vector and none of the new model's yet."""
        out = np.zeros(n, dtype=bool)
        held = min(n, len(self._has_previous))
        out[:held] = self._has_previous[:held] & ~self._has_vector[:held]
        return out

    def has_vector(self, record_id: str) -> bool:
        doc = self.doc_of.get(record_id)
        return doc is not None and bool(self._has_vector[doc])

    def needs_vector(self, record_id: str) -> bool:
        doc = self.doc_of.get(record_id)
        return doc is not None and not self._has_vector[doc]

    def indexed_vectors(self) -> int:
        return len(self.vectors)

    # -- querying -----------------------------------------------------------

    def neighbours(self, docs: Ints) -> Ints:
        """Neighbour documents within the window, shape (len(docs), 2 * window), -1 = none."""
        cols = []
        before, after = docs.copy(), docs.copy()
        for _ in range(self.settings.window):
            before = np.where(before >= 0, self._prev[np.maximum(before, 0)], -1)
            after = np.where(after >= 0, self._next[np.maximum(after, 0)], -1)
            cols += [before, after]
        return np.stack(cols, axis=1) if cols else np.zeros((len(docs), 0), dtype=np.int64)

    def similarities(self, docs: Ints, query_vector: Floats | None,
                     previous_vector: Floats | None = None) -> Floats:
        """Cosine of each doc to the query; NaN where the doc has no vector yet. During a
        re-embedding, a doc the new model has not reached is scored by the previous model's
        vector against the query embedded by that model."""
        out = np.full(len(docs), np.nan, dtype=np.float32)
        have = self._has_vector[docs]
        if query_vector is not None and have.any():
            out[have] = self.vectors.vectors(docs[have]) @ query_vector
        if previous_vector is not None and self.previous is not None:
            old = self._only_previous(len(self.ids))[docs]
            if old.any():
                out[old] = self.previous.vectors(docs[old]) @ previous_vector
        return out

    def search(
        self,
        query: str,
        query_vector: Floats | Callable[[], Floats | None] | None,
        mode: str,
        allowed: npt.NDArray[np.bool_] | None = None,
        previous_vector: Floats | Callable[[], Floats | None] | None = None,
    ) -> list[tuple[int, float]]:
        """Candidate documents with relevance, best first (lexical | semantic | hybrid).

        ``query_vector`` may be a callable (a pending embedding): it is called only after
        the lexical scores are computed, so the two can overlap. ``previous_vector`` (the
        query embedded by the model being replaced, or a callable giving it) ranks the
        documents the new model has not embedded yet by their previous vectors.
        """
        cfg = self.settings
        n = len(self.ids)
        if not n:
            return []
        if mode == "lexical":
            return self._lexical(query, allowed)
        lex = np.zeros(n, np.float32)
        if mode == "hybrid":
            matched, scores = self._matched(query, allowed)
            lex[matched] = scores
            seeds = matched[_top(scores, cfg.depth)].tolist()
        else:
            seeds = []
        if callable(query_vector):
            query_vector = query_vector()
        if query_vector is not None and len(self.vectors):
            seeds += [
                d for d, sim in self._dense(query_vector, allowed) if sim >= cfg.min_similarity
            ]
        if self.previous is None:
            previous_vector = None
        elif callable(previous_vector):
            previous_vector = previous_vector()
        if previous_vector is not None:
            seeds += [d for d, sim in self._dense_previous(previous_vector, allowed)
                      if sim >= cfg.min_similarity]
        if not seeds:
            return []
        candidates = np.unique(np.asarray(seeds, dtype=np.int64))
        near = self.neighbours(candidates)
        pool = np.unique(np.concatenate([candidates, near[near >= 0]]))
        if allowed is not None:
            pool = pool[allowed[pool]]
        sims = self.similarities(pool, query_vector, previous_vector)
        own_sim = np.nan_to_num(sims, nan=0.0)
        pool_near = self.neighbours(pool)
        near_idx = _positions(pool, pool_near)
        dense = _blend(sims, near_idx, cfg.dense_neighbour_weight)
        lex_pool = lex[pool]
        keep = (lex_pool > 0) | (own_sim >= cfg.min_similarity)
        if mode == "semantic":
            fused = _normalise(dense, low=None)
        else:
            fused = cfg.lexical_weight * _normalise(lex_pool, low=0.0) + (
                1.0 - cfg.lexical_weight
            ) * _normalise(dense, low=None)
        fused = self._date_boost(fused, pool, date_mentions(query))
        if cfg.smoothing > 0 and near_idx.size:
            base = _normalise(fused, low=0.0)
            padded = np.append(base, 0.0)
            fused = base + cfg.smoothing * padded[near_idx].max(axis=1)
        chosen = np.flatnonzero(keep & (fused > 0))
        if mode == "hybrid" and len(chosen):
            # Priors, on the scale of the best candidate: a question asks, its answer informs.
            fused = fused / float(fused[chosen].max()) + self._prior[pool]
        chosen = chosen[np.argsort(-fused[chosen], kind="stable")]
        return list(zip(pool[chosen].tolist(), fused[chosen].tolist(), strict=True))

    def _dense(self, query_vector: Floats, allowed: Mask | None) -> list[tuple[int, float]]:
        """The ``depth`` nearest documents among ``allowed``: exact cosine over their rows when
        they are few; else the vector index, widened until enough of its hits are allowed."""
        depth = self.settings.depth
        if allowed is None:
            return self.vectors.search(query_vector, depth)
        n = len(self.ids)
        docs = np.flatnonzero(allowed[:n] & self._has_vector[:n])
        if not len(docs):
            return []
        if len(docs) <= EXACT_FILTERED:
            sims = self.vectors.vectors(docs) @ query_vector
            best = _top(sims, depth)
            return list(zip(docs[best].tolist(), sims[best].tolist(), strict=True))
        total = len(self.vectors)
        width = min(total, int(depth * 2 * total / len(docs)) + depth)
        while True:
            found = [(d, sim) for d, sim in self.vectors.search(query_vector, width) if allowed[d]]
            if len(found) >= depth or width >= total:
                return found[:depth]
            width = min(total, width * 2)

    def _dense_previous(self, previous_vector: Floats,
                        allowed: Mask | None) -> list[tuple[int, float]]:
        """The ``depth`` nearest documents by the previous model's vectors, among those the
        new model has not embedded yet (exact: a re-embedding shrinks them as it goes)."""
        assert self.previous is not None
        n = len(self.ids)
        only = self._only_previous(n)
        if allowed is not None:
            only &= allowed[:n]
        keys, rows = self.previous.items()  # views: one product over every row, no copy
        usable = only[keys]
        if not usable.any():
            return []
        docs = keys[usable]
        sims = (rows @ previous_vector.astype(np.float32))[usable]
        best = _top(sims, self.settings.depth)
        return list(zip(docs[best].tolist(), sims[best].tolist(), strict=True))

    def _lexical(
        self, query: str, allowed: npt.NDArray[np.bool_] | None
    ) -> list[tuple[int, float]]:
        """BM25 over a record's terms plus its neighbours' (no fusion, no smoothing)."""
        matched, scores = self._matched(query, allowed)
        scores = self._date_boost(scores, matched, date_mentions(query))
        best = _top(scores, self.settings.depth)
        return list(zip(matched[best].tolist(), scores[best].tolist(), strict=True))

    def _matched(self, query: str, allowed: npt.NDArray[np.bool_] | None) -> tuple[Ints, Floats]:
        """(documents with a query term, their BM25), limited to ``allowed`` documents."""
        matched, scores = self.lexical.sparse_scores(terms_of(query))
        if allowed is None:
            return matched, scores
        keep = allowed[matched]
        return matched[keep], scores[keep]

    def _date_boost(self, scores: Floats, docs: Ints, named: list[DateMention]) -> Floats:
        """Raise the documents whose date matches a date the query names (see module doc)."""
        if not named or not len(docs) or self.settings.date_boost <= 0:
            return scores
        dates = self._dates[docs]
        hit = np.zeros(len(docs), dtype=bool)
        for mention in named:
            match = dates[:, 0] > 0
            for column, part in enumerate((mention.year, mention.month, mention.day)):
                if part is not None:
                    match &= dates[:, column] == part
            hit |= match
        if hit.all() or not hit.any():  # no preference among the candidates
            return scores
        boosted = scores + self.settings.date_boost * float(scores.max()) * hit
        return boosted.astype(np.float32)

    def run_mask(self, run_id: str) -> npt.NDArray[np.bool_]:
        """Documents of one run (for a run-scoped search)."""
        number = self._run_numbers.get(run_id, -2)
        mask: npt.NDArray[np.bool_] = self._run_of[: len(self.ids)] == number
        return mask


def _asks(text: str) -> bool:
    """A record that is a question: its text ends in "?"."""
    return text.rstrip().endswith("?")


def _top(scores: Floats, depth: int) -> Ints:
    """Indexes of the ``depth`` highest scores, best first (ties in index order)."""
    n = len(scores)
    depth = min(depth, n)
    if depth <= 0:
        return np.zeros(0, dtype=np.int64)
    top = np.argpartition(-scores, depth - 1)[:depth] if depth < n else np.arange(n)
    out: Ints = top[np.argsort(-scores[top], kind="stable")].astype(np.int64)
    return out


def _positions(pool: Ints, docs: Ints) -> Ints:
    """Index of each doc in the sorted ``pool``, -1 where absent."""
    if not docs.size:
        return docs
    at = np.minimum(np.searchsorted(pool, docs), len(pool) - 1)
    return np.where((docs >= 0) & (pool[at] == docs), at, -1)


def _blend(sims: Floats, near_idx: Ints, weight: float) -> Floats:
    """(1 - w) x own cosine + w x mean cosine of the neighbours that have one."""
    own = np.nan_to_num(sims, nan=0.0)
    if weight <= 0 or near_idx.size == 0:
        return own
    padded = np.append(sims, np.nan)
    around = padded[near_idx]  # -1 picks the NaN pad
    counts = np.sum(~np.isnan(around), axis=1)
    means = np.where(counts > 0, np.nansum(around, axis=1) / np.maximum(counts, 1), own)
    return ((1.0 - weight) * own + weight * means).astype(np.float32)


def _normalise(scores: Floats, *, low: float | None) -> Floats:
    if not len(scores):
        return scores
    floor = float(scores.min()) if low is None else low
    span = float(scores.max()) - floor
    if span <= 1e-12:  # all equal: every candidate counts fully (all zero stays zero)
        return (scores > 0 if low is not None else np.ones_like(scores, dtype=bool)).astype(
            np.float32
        )
    return ((scores - floor) / span).astype(np.float32)
