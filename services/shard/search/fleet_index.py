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

Erasure (:meth:`FleetIndex.remove`) takes records out in place and leaves the index a
rebuild from the remaining records would give (in the order they were added): their
documents become holes (numbers never given again, in no candidate set, no vector, no
terms, no filter entry), their run neighbours are linked to each other and get their
documents recomputed from their own texts (which the caller reads from the store: the
index keeps no document's own terms, only each run's last ``window``), and a term,
tag or metadata pair only they held leaves the index.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from services.shard.retrieval.lexical import GrowingBM25
from services.shard.retrieval.text import (
    MAX_QUERY_TERMS,
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
_Key = TypeVar("_Key")
_Doc = TypeVar("_Doc")

EXACT_FILTERED = 8192
"""A filter matching at most this many vectors is searched exactly over their rows."""
IN_PLACE_MAX_HOLES = 0.25
"""Erasure removes in place while at most this share of the fleet's document numbers are
holes afterwards; past it the fleet is rebuilt (and compacted) instead."""


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


MAX_QUERY_DATES = 8
"""Distinct dates a query's boost looks for: each is a pass over the matched documents, and
'2021 ' x 1,637 made 1,637 of them (0.13 s at 50k records; found in review, 2026-11-30)."""


def query_dates(query: str) -> list[DateMention]:
    """The dates ``query`` names, each once, at most MAX_QUERY_DATES."""
    return list(dict.fromkeys(date_mentions(query)))[:MAX_QUERY_DATES]


def terms_of(text: str) -> dict[str, float]:
    return _term_counts(tokenize(text))


def _term_counts(tokens: list[str]) -> dict[str, float]:
    return {t: float(c) for t, c in Counter(analyze_tokens(tokens, stop_words=STOP_WORDS)).items()}


@dataclass(frozen=True)
class _Removal:
    """What taking records out in place touches (document numbers)."""

    gone: set[int]
    runs: dict[int, str]
    """The run of each erased document ("" for none)."""
    changed: dict[int, tuple[list[int], list[int]]]
    """Remaining documents whose neighbour window changes: their new (before, after)."""
    tails: dict[str, list[int]]
    """Runs whose kept tail held an erased record: their new tail, oldest first."""
    needed: set[int]
    """Documents whose own terms the changed documents and tails are made of."""


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
        self._key_later: dict[bytes, list[str]] | None = {}
        """Later records of a held text key, in order (None: not known, loaded from a
        format-3 snapshot; an erasure then rebuilds the fleet)."""
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
        """Records held (``ids`` also has an empty slot for each one erased in place)."""
        return len(self.doc_of)

    def __getstate__(self) -> dict[str, object]:
        """Everything but the vectors (an index snapshot: vectors are stored in the database)."""
        return {k: v for k, v in self.__dict__.items() if k not in _VECTOR_STATE}

    def snapshot_copy(self) -> FleetIndex:
        """A private copy of what :meth:`__getstate__` gives, to pickle after the caller lets
        go of the fleet's lock (it serves nothing else: no vectors): every container and array
        the index changes in place is copied, so nothing done to this index afterwards (adds,
        extensions, merges, erasures) changes what the copy pickles as (see
        :data:`_SNAPSHOT_COPY`). Packing the postings is most of its time; copying the rest
        took about 20 ms at 100k records, where pickling the copy takes half a second."""
        copy = FleetIndex.__new__(FleetIndex)
        state = self.__getstate__()
        unknown = state.keys() - _SNAPSHOT_COPY.keys()
        if unknown:  # a new attribute: say how to copy it rather than share it unseen
            raise TypeError(f"FleetIndex.snapshot_copy has no copy rule for {sorted(unknown)}")
        copy.__dict__.update({name: _SNAPSHOT_COPY[name](value) for name, value in state.items()})
        return copy

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_key_later", None)  # a format-3 snapshot
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
        # What can fail on the text runs first: a record whose analysis raises leaves the
        # index as it was (the caller drops the change), not half added (found in review).
        cfg = self.settings
        tokens = tokenize(text)
        own = _term_counts(tokens)
        prior = cfg.length_prior * np.log1p(len(tokens)) + (
            0.0 if _asks(text) else cfg.statement_prior)
        holder = self.text_keys.setdefault(text_key, record_id) if text_key else record_id
        if holder != record_id and self._key_later is not None:
            self._key_later.setdefault(text_key, []).append(record_id)
        doc = len(self.ids)
        self._grow(doc + 1)
        self._add_facts(doc, facts or DocFacts())
        if day is not None:
            self._dates[doc] = (day.year, day.month, day.day)
        self._prior[doc] = prior
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
        if mask is not None and len(self.doc_of) < n:
            mask &= self._run_of[:n] >= 0  # erased in place: a hole matches no condition
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

    # -- erasing in place -----------------------------------------------------

    def in_place_allowed(self, record_ids: Collection[str]) -> bool:
        """Whether :meth:`remove` may take these records out, else the caller rebuilds: not
        once more runs were seen than ``max_open_runs`` (a run's kept tail may have been let
        go: which records shared terms then depends on the order of every record), nor when
        the later holders of text keys are not known (loaded from a format-3 snapshot), nor
        when more than ``IN_PLACE_MAX_HOLES`` of the document numbers would be holes (a
        large erasure: a rebuild compacts them)."""
        runs = len(self._run_numbers) - ("" in self._run_numbers)
        if runs > self.settings.max_open_runs or self._key_later is None:
            return False
        held = sum(1 for record_id in set(record_ids) if record_id in self.doc_of)
        holes = len(self.ids) - len(self.doc_of) + held
        return holes <= IN_PLACE_MAX_HOLES * len(self.ids)

    def removal_texts(self, record_ids: Collection[str]) -> list[str]:
        """The records whose texts :meth:`remove` needs for these (held) records: their run
        neighbours, whose documents change, and those documents' new neighbours."""
        return [self.ids[doc] for doc in sorted(self._removal(record_ids).needed)]

    def remove(self, record_ids: Collection[str], texts: Mapping[str, str]) -> None:
        """Take these records out in place (ids not held are skipped); ``texts`` holds the
        text of each record :meth:`removal_texts` names. Afterwards the index answers as
        one built from the remaining records would: see the module docstring."""
        plan = self._removal(record_ids)
        if not plan.gone:
            return
        own = {doc: terms_of(texts[self.ids[doc]]) for doc in plan.needed}
        gone = sorted(plan.gone)
        for doc in gone:
            self._unlink(doc, plan.runs.get(doc, ""))
        self._retail(plan.tails, own)
        self.lexical.drop(plan.gone | set(plan.changed), holes=plan.gone)
        self.lexical.refill((doc, self._bags(doc, own, before, after))
                            for doc, (before, after) in sorted(plan.changed.items()))
        self._drop_keys({self.ids[doc] for doc in gone})
        self._drop_facts(plan.gone)
        self.vectors.remove(gone)
        self._has_vector[gone] = False
        if self.previous is not None:
            self.previous.remove(gone)
            self._has_previous[[d for d in gone if d < len(self._has_previous)]] = False
        for doc in gone:
            del self.doc_of[self.ids[doc]]
            self.ids[doc] = ""

    def _removal(self, record_ids: Collection[str]) -> _Removal:
        gone = {self.doc_of[i] for i in set(record_ids) if i in self.doc_of}
        window = self.settings.window
        changed: dict[int, tuple[list[int], list[int]]] = {}
        for doc in gone:  # within ``window`` steps of an erased record: its window changes
            for links in (self._prev, self._next):
                at = doc
                for _ in range(window):
                    at = int(links[at])
                    if at < 0:
                        break
                    if at not in gone and at not in changed:
                        changed[at] = (self._live_steps(at, self._prev, gone),
                                       self._live_steps(at, self._next, gone))
        needed = set(changed)
        for before, after in changed.values():
            needed.update(before, after)
        numbers = {int(self._run_of[doc]) for doc in gone}
        names = {n: run_id for run_id, n in self._run_numbers.items() if n in numbers}
        runs = {doc: names[int(self._run_of[doc])] for doc in gone}
        tails: dict[str, list[int]] = {}
        for run_id in set(runs.values()) - {""}:
            tail = self._run_tail.get(run_id)
            if tail is not None and any(doc in gone for doc, _ in tail):
                last = self._last_of_run[run_id]
                if last in gone:
                    last = self._live_step(last, self._prev, gone)
                kept = [] if last < 0 else [last, *self._live_steps(last, self._prev, gone)]
                tails[run_id] = kept[: self.settings.window][::-1]
                needed.update(tails[run_id])
        return _Removal(gone, runs, changed, tails, needed)

    def _live_step(self, doc: int, links: Ints, gone: set[int]) -> int:
        """The nearest document along ``links`` that is not in ``gone`` (-1: none)."""
        doc = int(links[doc])
        while doc >= 0 and doc in gone:
            doc = int(links[doc])
        return doc

    def _live_steps(self, doc: int, links: Ints, gone: set[int]) -> list[int]:
        """The ``window`` nearest documents along ``links`` not in ``gone``, nearest first."""
        found: list[int] = []
        while len(found) < self.settings.window:
            doc = self._live_step(doc, links, gone)
            if doc < 0:
                break
            found.append(doc)
        return found

    def _unlink(self, doc: int, run_id: str) -> None:
        """Join the document's run neighbours to each other; its run ends before it if it
        was the last."""
        before, after = int(self._prev[doc]), int(self._next[doc])
        if before >= 0:
            self._next[before] = after
        if after >= 0:
            self._prev[after] = before
        self._prev[doc] = self._next[doc] = -1
        if run_id and self._last_of_run.get(run_id) == doc:
            if before >= 0:
                self._last_of_run[run_id] = before
            else:
                del self._last_of_run[run_id]

    def _retail(self, tails: dict[str, list[int]], own: dict[int, dict[str, float]]) -> None:
        """Runs whose kept tail held an erased record keep their last remaining ones, in the
        order a rebuild would have touched them (a run that lost all goes)."""
        moved = False
        for run_id, docs in tails.items():
            if not docs:
                del self._run_tail[run_id]
                continue
            moved |= self._run_tail[run_id][-1][0] != docs[-1]  # its last record went
            self._run_tail[run_id] = [(doc, own[doc]) for doc in docs]
        if moved:  # least recently extended first, as the runs' last records came
            ordered = sorted(self._run_tail.items(), key=lambda item: item[1][-1][0])
            self._run_tail = OrderedDict(ordered)

    def _bags(self, doc: int, own: dict[int, dict[str, float]], before: list[int],
              after: list[int]) -> list[dict[str, float]]:
        """``doc``'s document as :meth:`add` and its later neighbours' arrivals would have
        made it: own and earlier records' terms at once, then each later record's."""
        cfg = self.settings
        bag = dict(own[doc])
        tail = before[::-1]  # oldest first, as add() reads a run's tail
        for i, earlier in enumerate(tail):
            step = cfg.distance_decay ** (len(tail) - 1 - i)
            for term, count in own[earlier].items():
                bag[term] = bag.get(term, 0.0) + step * cfg.before_weight * count
        bags = [bag]
        for k, later in enumerate(after):
            weight = cfg.distance_decay ** k * cfg.after_weight
            bags.append({t: weight * c for t, c in own[later].items()})
        return bags

    def _drop_keys(self, gone: set[str]) -> None:
        """Erased records leave the text keys; a later record of a key its erased first
        holder held becomes the holder."""
        assert self._key_later is not None, "in_place_allowed() said no"
        _drop_docs(self._key_later, gone)
        for key in [key for key, holder in self.text_keys.items() if holder in gone]:
            later = self._key_later.pop(key, [])
            if later:
                self.text_keys[key] = later[0]
                if later[1:]:
                    self._key_later[key] = later[1:]
            else:
                del self.text_keys[key]

    def _drop_facts(self, gone: set[int]) -> None:
        """Erased documents leave every filter; a tag or metadata pair only they had goes."""
        _drop_docs(self._by_tag, gone)
        _drop_docs(self._by_metadata, gone)
        holes = np.fromiter(gone, dtype=np.int64)
        self._run_of[holes] = self._agent_of[holes] = self._domain_of[holes] = -1
        self._created[holes] = 0
        self._importance[holes] = self._prior[holes] = 0.0
        self._dates[holes] = 0

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
            out[have] = self.vectors.dots(docs[have], query_vector)
        if previous_vector is not None and self.previous is not None:
            old = self._only_previous(len(self.ids))[docs]
            if old.any():
                out[old] = self.previous.dots(docs[old], previous_vector)
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
        fused = self._date_boost(fused, pool, query_dates(query))
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
            sims = self.vectors.dots(docs, query_vector)
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
        scores = self._date_boost(scores, matched, query_dates(query))
        best = _top(scores, self.settings.depth)
        return list(zip(matched[best].tolist(), scores[best].tolist(), strict=True))

    def _matched(self, query: str, allowed: npt.NDArray[np.bool_] | None) -> tuple[Ints, Floats]:
        """(documents with a query term, their BM25), limited to ``allowed`` documents. At
        most MAX_QUERY_TERMS of the query's terms are scored, the rarest (the most telling,
        and the cheapest), as the store's full-text search keeps: an 8 KB query of 1,300
        common terms took 0.15 s at 10k records under the fleet's lock (found in review,
        2026-11-30)."""
        terms = terms_of(query)
        if len(terms) > MAX_QUERY_TERMS:
            present = [t for t in terms if self.lexical.postings_size(t)]
            present.sort(key=self.lexical.postings_size)
            terms = {t: terms[t] for t in present[:MAX_QUERY_TERMS]}
        matched, scores = self.lexical.sparse_scores(terms)
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


def _same(value: Any) -> Any:
    """Never changed in place (a frozen dataclass): shared with the copy."""
    return value


def _array_copy(value: Any) -> Any:
    """A numpy array the index writes in place (whole: its spare room is saved too)."""
    return value.copy()


def _lists_copy(value: Any) -> Any:
    """A dict whose lists the index appends to in place: each list copied."""
    return None if value is None else {key: list(docs) for key, docs in value.items()}


def _tails_copy(value: Any) -> Any:
    """The kept run tails: the LRU order and each tail's list copied. A tail's term dicts are
    never changed once made (a new tail is a new list of new or unchanged pairs)."""
    return OrderedDict((run_id, list(tail)) for run_id, tail in value.items())


def _lexical_copy(value: Any) -> Any:
    return value.snapshot_copy()


_SNAPSHOT_COPY: dict[str, Callable[[Any], Any]] = {
    "settings": _same,
    "ids": list,  # an erasure blanks its slot in place
    "doc_of": dict,
    "lexical": _lexical_copy,
    "_prev": _array_copy,
    "_next": _array_copy,
    "_run_of": _array_copy,
    "_dates": _array_copy,
    "_prior": _array_copy,
    "_run_numbers": dict,
    "_run_tail": _tails_copy,
    "_last_of_run": dict,
    "text_keys": dict,
    "_key_later": _lists_copy,
    "_agent_of": _array_copy,
    "_domain_of": _array_copy,
    "_created": _array_copy,
    "_importance": _array_copy,
    "_agent_numbers": dict,
    "_domain_numbers": dict,
    "_by_tag": _lists_copy,
    "_by_metadata": _lists_copy,
}
"""How :meth:`FleetIndex.snapshot_copy` copies each attribute a snapshot holds (strings,
bytes, numbers and tuples in them are immutable, so one level of copying is a snapshot)."""


def _drop_docs(table: dict[_Key, list[_Doc]], gone: set[_Doc]) -> None:
    """``gone`` out of each key's documents (numbers or ids); a key left with none goes."""
    for key in [key for key, docs in table.items() if not gone.isdisjoint(docs)]:
        kept = [doc for doc in table[key] if doc not in gone]
        if kept:
            table[key] = kept
        else:
            del table[key]


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
