"""SearchIndex: every fleet's in-memory retrieval state (terms, vectors, run neighbours).

It serves every search mode: lexical alone when the shard runs without an
embedding provider, semantic and hybrid too with one. A :class:`SeqCursor`
follows the records table by ``seq`` and adds each new record to its fleet's
:class:`FleetIndex` (terms, run neighbours); every search first advances it, so
a committed record is findable at once, on every replica, including one whose
transaction committed after a higher seq was read (the cursor re-reads the
seqs it stepped over). The record then waits in a queue for the background
indexer, which loads its stored vector (written by this or another replica) or
embeds the content and stores it; a failed round puts its batch back.
A write only wakes the indexer (writes never wait for the model). ``lag()`` is
the number of committed records without a vector in the index yet.

Embedder failures nobody is told of are counted in ``embedder_failures`` by stage (read
by ShardMetrics as ``engram_shard_embedder_failures_total``): ``query``, a hybrid search
ranked lexically because its query could not be embedded (a semantic search fails
UNAVAILABLE instead, counted with the errors answered); ``index``, an indexing batch put
back because the embedder failed.

Restart: the lexical index is saved to a file (:mod:`snapshot`) when the shard
stops, after a start that had to rebuild, and as it grows (every
``snapshot_every`` records); :meth:`SearchIndex.warm_up` loads it, checks it
against the store (records through its seq, the id at that seq) and reads only
what was committed since; a missing, damaged or stale file means a rebuild from
the records. Until warm-up ends, searches and duplicate checks fail fast with
UNAVAILABLE (not a wait on the rebuild) and health stays NOT_SERVING; vectors of
the snapshot's records are then loaded from the database by the indexer.

Locks: each fleet's index has its own, held while that fleet is searched (scoring) or
checked for duplicates; the shared lock guards only the cursor and queues, never while
scoring. New records and vectors are handed to a fleet through its inbox, applied by
whoever next holds that fleet's lock, so a long search in one fleet delays no other
fleet's write or search.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from services.common.db import Database
from services.common.errors import Unavailable
from services.common.metrics import Tally
from services.common.priority import lower_this_thread
from services.shard.repository import RecordText, ShardRepository, StoredVector
from services.shard.retrieval.embedding import EmbeddingProvider
from services.shard.search.cursor import SeqCursor
from services.shard.search.fleet_index import (
    ContextSettings,
    DocFacts,
    DocFilter,
    FleetIndex,
    metadata_day,
)
from services.shard.search.snapshot import (
    Frame,
    SnapshotRejected,
    fleet_frame,
    header_for,
    read_snapshot,
    temporary_of,
    write_snapshot,
)

log = logging.getLogger("engram.shard.index")


@dataclass(frozen=True)
class StoredDuplicate:
    """A new text duplicates one of these stored records (best first); the caller keeps the
    first of the same author and run: semantic candidates may be anyone's."""

    record_ids: tuple[str, ...]


@dataclass(frozen=True)
class BatchDuplicate:
    """A new text duplicates the text at ``index`` earlier in its own batch."""

    index: int


Duplicate = StoredDuplicate | BatchDuplicate
Pending = tuple[int, str, str, str]  # seq, fleet, record id, text
FleetChange = Callable[[FleetIndex], None]


@dataclass
class _FleetSlot:
    """One fleet's index, the lock its readers and writers hold, and the changes other
    threads handed it while it was busy (applied in order by the next holder)."""

    index: FleetIndex
    failures: Tally
    """The index's ``change_failures``, shared by every fleet."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    inbox: deque[FleetChange] = field(default_factory=deque)

    def apply_inbox(self) -> None:
        """Under ``lock``: apply what was handed over, oldest first. The holder may be any
        caller that takes the fleet (a search, another agent's write): a change that raises
        is logged, counted in ``failures`` and dropped, never that caller's error. Before, a
        record the stemmer could not analyse made another agent's next write fail INTERNAL
        (found in review)."""
        while self.inbox:
            _applied(self.inbox.popleft(), self.index, self.failures)


def _applied(change: FleetChange, index: FleetIndex, failures: Tally) -> None:
    """Apply ``change``; one that raises is logged, counted and dropped. What can fail
    on a record's text (its analysis) runs before :meth:`FleetIndex.add` changes anything,
    so the record is only left out of this replica's index; a rebuild from the store (an
    erasure's, a start without the snapshot) meets the same record and leaves it out too."""
    try:
        change(index)
    except Exception:
        failures.add()
        log.exception("a change to the fleet's search index failed and was dropped: the "
                      "record is stored but left out of this replica's search index",
                      extra={"record_id": getattr(change, "record_id", "")})


_NEAR_CANDIDATES = 16
"""Nearest stored records a semantic duplicate check considers (others' may come first)."""
_NEAR_PENDING = 1000
"""Queued (and, as many, lately handed) records a semantic dedup compares a write with."""
PREVIOUS_PAGE = 5000
"""Stored vectors of the previous model read per query while they are loaded."""
PREVIOUS_RETRY_SECONDS = 0.5
PREVIOUS_RETRY_MAX_SECONDS = 30.0
"""A failed page is read again after 0.5 s, doubling up to 30 s, until the shard stops..."""
PREVIOUS_GIVE_UP_SECONDS = 600.0
"""...or until pages have failed for this long without one read: the load ends (logged as an
error), what was loaded is served, and the re-embedding retires the previous model when it
ends rather than the model being held for good by a query that never succeeds."""


def _lexical_if_unavailable(
    pending: Callable[[], np.ndarray], failures: Tally,
) -> Callable[[], np.ndarray | None]:
    """A hybrid search whose query could not be embedded ranks lexically (and says so in
    the log, and counts it in ``failures`` as ``query``) rather than failing; a semantic
    search fails UNAVAILABLE."""

    def vector() -> np.ndarray | None:
        try:
            return pending()
        except Unavailable as error:
            failures.add("query")
            log.warning("query not embedded, hybrid search ranks lexically: %s", error)
            return None

    return vector


def _nothing() -> None:
    return None


def _previous_query(previous: EmbeddingProvider, text: str) -> np.ndarray | None:
    """The query embedded by the model being replaced; None if it cannot be (the model was
    let go as the re-embedding ended, or it failed): only the new model's vectors rank then."""
    try:
        vector: np.ndarray = previous.embed([text])[0]
    except Exception as error:  # an aid to ranking, never a reason to fail a search
        log.warning("query not embedded by the previous model: %s", error)
        return None
    return vector


class SearchIndex:
    def __init__(
        self,
        database: Database,
        embedder: EmbeddingProvider | None,
        *,
        batch: int = 64,
        poll_s: float = 0.5,
        debounce_s: float = 0.05,
        hnsw_threshold: int = 10_000,
        context: ContextSettings | None = None,
        niceness: int = 10,
        snapshot_path: Path | None = None,
        snapshot_every: int = 100_000,
        previous: EmbeddingProvider | None = None,
    ) -> None:
        self.db = database
        self.previous = previous
        """The model the stored vectors were made with, while ``embedder`` re-embeds them:
        its vectors rank the records not re-embedded yet (None: no re-embedding served)."""
        self.snapshot_path = snapshot_path
        self.snapshot_every = snapshot_every
        self.repo = ShardRepository(database.dialect)
        self.niceness = niceness
        self.embedder = embedder
        self.batch = batch
        self.poll_s = poll_s
        self.debounce_s = debounce_s
        self.hnsw_threshold = hnsw_threshold
        self.context = context or ContextSettings()
        self._fleets: dict[str, _FleetSlot] = {}
        self._cursor = SeqCursor()  # records handed to the fleet indexes (late commits too)
        self._in_flight: Counter[str] = Counter()  # taken from _pending, not indexed yet, by fleet
        self._pending: deque[Pending] = deque()
        self._fresh_vectors: dict[str, np.ndarray] = {}  # embedded at write time (dedup)
        # Taken from _pending for embedding: a write's semantic dedup still compares with them
        # until their vectors are surely in the fleet's index (until then, in neither).
        self._to_embed_recent: deque[Pending] = deque(maxlen=_NEAR_PENDING)
        self._lock = threading.Lock()  # cursor, queues, the fleet table; never held to score
        self._sync_lock = threading.Lock()
        self._query_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="query-embed")
        self._ticks = itertools.count()  # orders sync() arrivals and reads
        self._synced_tick = -1  # tick at which the last read began
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loader: threading.Thread | None = None  # the previous model's vectors
        self._ready = threading.Event()  # warmed up: searches and duplicate checks answered
        self._last_id = ""  # id of the record at the cursor's position
        self._saved_records = 0  # records in the last snapshot written or loaded
        self._handed = 0  # records handed to the fleet indexes: those through the cursor
        self._save_lock = threading.RLock()  # a forget holds it through its own save
        # Erased ids, with the tick of their forget, kept while a read or an embedding batch
        # that began before it is still going: what such a read hands over after the forget
        # (it read the row before the erasure committed) is dropped instead of coming back.
        self._erased_recent: dict[str, int] = {}
        self._active: set[int] = set()  # ticks at which those reads and batches began
        self._backfill = (0, 0)  # (after, through): seqs whose vectors the indexer still loads
        self._tombstones_seen = -1  # tombstones in the store when the indexer last looked
        self._tombstones_checked = -float("inf")  # when it last looked (monotonic seconds)
        self.loaded_from_snapshot = False
        self.embedder_failures = Tally()
        """Embedder failures absorbed without an error, by stage: ``query`` (a hybrid search
        ranked lexically), ``index`` (an indexing batch put back to be retried)."""
        self.change_failures = Tally()
        """Index changes that raised and were dropped (:meth:`_FleetSlot.apply_inbox`)."""

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Warm up (load the snapshot, catch up), then index in the background."""
        if self._thread is None:
            self.warm_up()
            if self.previous is not None:
                # Beside the indexer, not before it: at a million records this reads
                # gigabytes, and new records must be indexed (re-embedded) meanwhile.
                self._loader = threading.Thread(target=self._load_previous, daemon=True,
                                                name="previous-vectors")
                self._loader.start()
            self._thread = threading.Thread(target=self._run, name="search-indexer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in (self._loader, self._thread):
            if thread is not None:
                thread.join(timeout=5)
        self._query_pool.shutdown(wait=False, cancel_futures=True)
        if self._ready.is_set() and self._handed != self._saved_records:
            try:
                self.save_snapshot()
            except OSError:  # a full disk must not stop the shard from stopping
                log.exception("index snapshot not saved; the next start catches up from "
                              "the previous one or rebuilds")

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def require_ready(self) -> None:
        if not self._ready.is_set():
            raise Unavailable("the search index is loading after a start; retry shortly",
                              reason="INDEX_LOADING")

    def records(self) -> int:
        """Records in the lexical index (every fleet), what was handed to each applied first."""
        with self._lock:
            slots = list(self._fleets.values())
        total = 0
        for slot in slots:
            with slot.lock:
                slot.apply_inbox()
                total += len(slot.index)
        return total

    def warm_up(self) -> None:
        """Load the saved index if it matches the store, then read what was committed since.
        Searches are refused (UNAVAILABLE) until this returns. After a rebuild (no usable
        snapshot) the index is saved before it returns: a save right after SERVING would
        hold the fleets' locks and stall the first searches instead."""
        began = time.monotonic()
        loaded = self.loaded_from_snapshot = self._load_snapshot()
        with self._sync_lock:  # nothing searches yet: each chunk is indexed as it is read
            self._read_new(5000, apply=True)
            self._synced_tick = next(self._ticks)
        total = self.records()
        log.info("search index ready", extra={
            "records": total, "from_snapshot": loaded, "snapshot_records": self._saved_records,
            "seconds": round(time.monotonic() - began, 2)})
        if self.snapshot_path is not None and self._grown_since_saved():
            try:
                self.save_snapshot()  # rebuilt, or far behind its snapshot
            except OSError:  # a full disk must not keep the shard from serving
                log.exception("index snapshot not saved after the start")
        self._ready.set()

    def _load_snapshot(self) -> bool:
        if self.snapshot_path is None or not self.snapshot_path.exists():
            return False
        try:
            header, fleets = read_snapshot(self.snapshot_path, repr(self.context))
            with self.db.session() as session:
                held = self.repo.count_through(session, header.position, header.gaps)
                last_id = self.repo.id_at(session, header.position) if header.position else ""
            if held != header.records or (last_id or "") != header.last_id:
                raise SnapshotRejected(
                    f"the store holds {held} records through seq {header.position} "
                    f"(last {last_id!r}); the snapshot holds {header.records} (last "
                    f"{header.last_id!r})")
            if sum(len(f) for f in fleets.values()) < header.records:
                raise SnapshotRejected("the payload holds fewer records than its header")
        except SnapshotRejected as why:
            log.warning("index snapshot not used, rebuilding from the records: %s", why,
                        extra={"path": str(self.snapshot_path)})
            return False
        dimension = self.embedder.dimension if self.embedder is not None else 0
        with self._lock:
            for fleet_id, index in fleets.items():
                index.reset_vectors(dimension, self.hnsw_threshold)
                self._fleets[fleet_id] = _FleetSlot(index, self.change_failures)
            self._cursor.restore(header.position, header.gaps)
            self._last_id = header.last_id
            self._handed = header.records
            if self.embedder is not None:
                self._backfill = (0, header.position)
        self._saved_records = header.records
        return True

    def save_snapshot(self) -> int:
        """Write the lexical index to ``snapshot_path``; returns the records it holds.

        The cursor is read under the locks every reader takes, then each fleet in turn is
        copied under its own lock alone (:meth:`FleetIndex.snapshot_copy`: its containers and
        arrays, its postings packed) and pickled from that copy after the lock is let go:
        writes, catch-ups and every fleet's searches go on while it is pickled, hashed and
        written, and a fleet's searches wait only for the copy. A fleet copied later than
        the cursor was read may hold newer records too; a load reads them again from the
        store and skips them by id.
        """
        if self.snapshot_path is None:
            return 0
        with self._save_lock:
            with self._sync_lock, self._lock:
                slots = dict(self._fleets)
                position, gaps = self._cursor.position, self._cursor.gaps()
                last_id, records = self._last_id, self._handed
            frames: list[Frame] = []
            for fleet_id, slot in sorted(slots.items()):
                with slot.lock:
                    slot.apply_inbox()
                    copy = slot.index.snapshot_copy()
                frames.append(fleet_frame(fleet_id, copy))
                del copy  # one fleet's copy held at a time
            header = header_for(frames, position=position, gaps=gaps, records=records,
                                last_id=last_id, settings=repr(self.context))
            write_snapshot(self.snapshot_path, header, frames)
            self._saved_records = records
        log.info("index snapshot saved", extra={"records": records,
                                                "bytes": header.payload_bytes})
        return records

    def _load_previous(self) -> None:
        """The loader thread: the previous model's vectors, retried after a database error
        (a failed page is read again, nothing is let go for it) until the shard stops."""
        lower_this_thread(self.niceness)
        try:
            self._load_previous_vectors()
        except Exception:  # what was loaded is served; the rest ranks by its lexical score
            log.exception("the previous model's vectors were not all loaded")

    def _load_previous_vectors(self) -> None:
        """Every stored vector of the previous model into its fleet's index (a re-embedding
        replaces them one by one); none left: the previous model is let go at once. Reads a
        page at a time and stops between pages when the shard stops; the indexer retires
        the model only once this has returned."""
        previous = self.previous
        if previous is None:
            return
        if self.embedder is None or previous.name == self.embedder.name:
            log.warning("ENGRAM_SHARD_PREVIOUS_EMBEDDER (%s) is ignored: it is the model this "
                        "shard runs, or the shard runs none", previous.name)
            self._retire_previous()
            return
        loaded, after, pause = 0, 0, PREVIOUS_RETRY_SECONDS
        failing_since: float | None = None
        while not self._stop.is_set():
            try:
                with self.db.session() as session:
                    rows = self.repo.vectors_of_model(session, previous.name, after,
                                                      PREVIOUS_PAGE)
            except Exception as error:  # a database away for a while: read the page again
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= PREVIOUS_GIVE_UP_SECONDS:
                    log.error("the previous model's vectors: pages failed to load for %.0f s; "
                              "giving up with %d loaded (the others rank by their lexical "
                              "score until re-embedded): %s", now - failing_since, loaded,
                              error)
                    return
                log.warning("the previous model's vectors: a page failed to load, retrying in "
                            "%.1f s: %s", pause, error)
                self._stop.wait(pause)
                pause = min(pause * 2, PREVIOUS_RETRY_MAX_SECONDS)
                continue
            pause, failing_since = PREVIOUS_RETRY_SECONDS, None
            if not rows:
                break
            after = rows[-1].record_seq
            loaded += self._hand_previous(rows)
        if self._stop.is_set():
            return
        if not loaded:
            log.info("no record still needs a stored vector of the previous model %s; it is "
                     "not used", previous.name)
            self._retire_previous()
            return
        log.info("serving the previous model's vectors while the records are re-embedded",
                 extra={"previous_model": previous.name, "model": self.embedder.name,
                        "vectors": loaded})

    def _hand_previous(self, rows: Sequence[Any]) -> int:
        """One page of the previous model's vectors into the fleets' indexes, for the records
        not re-embedded yet (a record the current model has embedded never needs its old
        vector: holding it would only cost memory); returns how many were handed."""
        by_fleet: dict[str, tuple[list[str], list[np.ndarray]]] = {}
        for row in rows:
            ids, vectors = by_fleet.setdefault(row.fleet_id, ([], []))
            ids.append(row.record_id)
            vectors.append(np.frombuffer(row.vector, dtype="<f4"))
        loaded = 0
        for fleet_id, (ids, vectors) in by_fleet.items():
            with self._lock:
                slot = self._fleets.get(fleet_id)
            if slot is None:
                continue
            with slot.lock:
                slot.apply_inbox()
                known = [i for i, r in enumerate(ids) if slot.index.needs_vector(r)]
                if known:
                    slot.index.add_previous_vectors(
                        [slot.index.doc_of[ids[i]] for i in known],
                        np.stack([vectors[i] for i in known]).astype(np.float32))
                    loaded += len(known)
        return loaded

    def previous_held(self, fleet_id: str) -> int:
        """The previous model's vectors this fleet's index holds (loaded in the background
        after a start; 0 once the re-embedding has ended)."""
        with self._fleet(fleet_id) as index:
            return len(index.previous) if index is not None and index.previous else 0

    def _holds_previous(self, fleet_id: str) -> bool:
        with self._lock:
            slot = self._fleets.get(fleet_id)
        return slot is not None and slot.index.previous is not None  # a glance, no fleet lock

    def _retire_previous(self) -> None:
        """The re-embedding is complete (or there is none): drop the previous model's vectors
        and close the model."""
        previous, self.previous = self.previous, None
        if previous is None:
            return
        with self._lock:
            slots = list(self._fleets.values())
        for slot in slots:
            with slot.lock:
                slot.index.drop_previous()
        previous.close()

    def _grown_since_saved(self) -> bool:
        """``snapshot_every`` records (or a tenth of the index, if fewer) since the last save."""
        grown = self._handed - self._saved_records
        return grown >= min(self.snapshot_every, max(self._handed // 10, 1))

    def _save_if_grown(self) -> None:
        if self.snapshot_path is not None and self._ready.is_set() and self._grown_since_saved():
            self.save_snapshot()

    def notify(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        lower_this_thread(self.niceness)
        while not self._stop.is_set():
            try:
                while self.catch_up() and not self._stop.is_set():
                    pass
                self._apply_inboxes()
                loading = self._loader is not None and self._loader.is_alive()
                if self.previous is not None and not loading and self.lag() == 0:
                    log.info("re-embedding complete; the previous model's vectors are no "
                             "longer served", extra={"model": self.embedder and
                                                     self.embedder.name})
                    self._retire_previous()
                self._apply_erasures()
                self._save_if_grown()
            except Exception:  # the loop must survive a transient database error
                log.exception("search indexing failed; retrying")
            if self._wake.wait(self.poll_s):
                # Let a burst of writes land first: one catch-up per burst, not per write,
                # keeps the indexer off the write path's CPU (searches catch up on demand).
                self._stop.wait(self.debounce_s)
            self._wake.clear()

    # -- indexing -----------------------------------------------------------

    def sync(self, chunk: int = 5000) -> None:
        """Hand every record committed before this call to its fleet (no model): the fleet's
        next reader (``_fleet``) or the indexer thread adds it to the fleet's index.

        Concurrent callers share the work: a read that began after this call arrived has
        seen everything this call must see, so waiting for it is enough (under 64 writers
        in flight, one read per burst instead of one per write). Only the read is done under
        the sync lock, which every search and write of every fleet takes: the analysis of
        the texts (about 50 ms for a 32 KB record) is done under each fleet's own lock, so
        one fleet's bulky batch delays that fleet's searches, not another's (before, the
        syncing thread analysed every fleet's new records under the sync lock: one fleet's
        120 records of 32 KB held another fleet's next search for 6 s).
        """
        arrival = next(self._ticks)
        with self._sync_lock:
            if self._synced_tick > arrival:
                return
            began = next(self._ticks)
            self._read_new(chunk)
            self._synced_tick = began

    def _read_new(self, chunk: int, *, apply: bool = False) -> None:
        """Read committed records past the cursor (and the gaps it left) into their fleets'
        inboxes; with ``apply``, into their indexes too (a start, before anything searches:
        a store far ahead of the snapshot is not held in the inboxes whole)."""
        while True:
            gaps = self._cursor.gaps()
            with self._handing():
                with self.db.reading() as connection:
                    rows = self.repo.texts_after(connection, self._cursor.position, gaps, chunk)
                if not rows:
                    return
                touched: dict[str, _FleetSlot] = {}
                with self._lock:
                    # A row erased (and forgotten) since it was read is passed over.
                    kept = [row for row in rows if row.id not in self._erased_recent]
                    for row in kept:
                        slot = touched[row.fleet_id] = self._slot(row.fleet_id)
                        slot.inbox.append(_adder(row))
                        self._pending.append((row.seq, row.fleet_id, row.id, row.content))
                    self._cursor.advance(row.seq for row in rows)
                    self._handed += len(kept)
                    last = max(rows, key=lambda row: row.seq)
                    if last.seq == self._cursor.position:
                        self._last_id = last.id if last in kept else ""
            if apply:
                for slot in touched.values():
                    _apply_if_idle(slot)
            if len(rows) < chunk:
                return

    def _apply_inboxes(self) -> None:
        """The indexer thread, outside the sync lock: add what was handed to each fleet that
        no reader holds now (a reader applies its fleet's own when it takes it)."""
        with self._lock:
            waiting = [slot for slot in self._fleets.values() if slot.inbox]
        for slot in waiting:
            if self._stop.is_set():
                return
            _apply_if_idle(slot)

    @contextmanager
    def _handing(self) -> Iterator[None]:
        """Around a read of the store, or an embedding batch, whose records are handed over
        afterwards: erasures forgotten meanwhile are remembered until it ends."""
        with self._lock:
            began = next(self._ticks)  # each tick is drawn once: its own entry
            self._active.add(began)
        try:
            yield
        finally:
            with self._lock:
                self._active.discard(began)
                oldest = min(self._active, default=None)
                self._erased_recent = {i: tick for i, tick in self._erased_recent.items()
                                       if oldest is not None and oldest < tick}

    def _slot(self, fleet_id: str) -> _FleetSlot:
        """Under ``_lock``: the fleet's slot, created empty on first sight."""
        slot = self._fleets.get(fleet_id)
        if slot is None:
            slot = _FleetSlot(self._empty_index(), self.change_failures)
            self._fleets[fleet_id] = slot
        return slot

    def _empty_index(self) -> FleetIndex:
        dimension = self.embedder.dimension if self.embedder is not None else 0
        return FleetIndex(dimension, self.context, hnsw_threshold=self.hnsw_threshold)

    # -- erasure --------------------------------------------------------------

    def forget(self, fleet_id: str, erased: Collection[str]) -> bool:
        """Drop erased records (already deleted from the store); False if none was here.

        An erased text also shaped its run neighbours' terms, its text key and the fleet's
        vocabulary. In place first (:meth:`FleetIndex.remove`, milliseconds): under the
        fleet's lock, the texts of the run neighbours whose documents change are read from
        the store and the index is left as a rebuild from the remaining records would give.
        The fleet is rebuilt from the store instead when :meth:`FleetIndex.in_place_allowed`
        says no (a run's tail was let go; more than a quarter of its document numbers would
        be holes, which the rebuild compacts) or a neighbour's text is gone from the store
        (erased meanwhile). The rebuild runs beside the fleet's searches, which use the old
        index meanwhile (the erased rows are gone from the store, so no search returns them;
        until the swap their lent terms may still rank a neighbour); what was handed to the
        fleet during the rebuild is carried over at the swap. Either way no snapshot is saved
        in between, and the one saved after holds no erased term. Idempotent: records no
        longer here (a second call, another replica's erasure seen twice) cost nothing.
        """
        gone = set(erased)
        with self._lock:
            tick = next(self._ticks)
            if self._active:  # a read or batch going on may hand them over after this
                self._erased_recent.update(dict.fromkeys(gone, tick))
            self._pending = deque(item for item in self._pending if item[2] not in gone)
            self._to_embed_recent = deque(
                (item for item in self._to_embed_recent if item[2] not in gone),
                maxlen=_NEAR_PENDING)
            self._fresh_vectors.clear()  # keyed by text: a cache, refilled by the next writes
            slot = self._fleets.get(fleet_id)
        if slot is None:
            return False
        with self._save_lock:  # one rebuild at a time, and no save of the old index meanwhile
            with slot.lock:
                with self._lock:  # everything handed through the cursor is applied
                    slot.apply_inbox()
                    present = [i for i in gone if i in slot.index.doc_of]
                    if not present:
                        return False
                    position, gaps = self._cursor.position, self._cursor.gaps()
                began = time.monotonic()
                in_place = self._removed_in_place(slot.index, present)
            left = len(present)
            if in_place:
                log.info("records removed from the fleet index in place", extra={
                    "fleet_id": fleet_id, "erased": len(present), "records": len(slot.index),
                    "seconds": round(time.monotonic() - began, 4)})
            else:  # may drop more: a neighbour erased meanwhile (its own forget finds none)
                left = self._rebuild_without(fleet_id, slot, gone, len(present), position, gaps)
            with self._lock:  # only now: a failed removal or rebuild left them counted
                self._handed -= left
                if self._last_id in gone:
                    self._last_id = ""
            self._resave_after_erasure()
        return True

    def _resave_after_erasure(self) -> None:
        """Under ``_save_lock``: the saved snapshot holds the erased terms; replace it, or,
        when it cannot be saved now (not ready yet, a full disk), remove it. The store is the
        truth: a start without a snapshot rebuilds from it, slower but holding nothing erased,
        and the next save (soon: nothing counts as saved) writes a new one."""
        path = self.snapshot_path
        if path is None:
            return
        if self._ready.is_set():
            try:
                self.save_snapshot()
                return
            except Exception:
                log.exception("index snapshot save after an erasure failed; removing the "
                              "old snapshot, which holds the erased records' terms")
        path.unlink(missing_ok=True)
        temporary_of(path).unlink(missing_ok=True)
        self._saved_records = 0

    def _removed_in_place(self, index: FleetIndex, present: list[str]) -> bool:
        """Under the fleet's lock: take ``present`` out of ``index`` in place; False (nothing
        changed) when the fleet must be rebuilt instead."""
        if not index.in_place_allowed(present):
            return False
        needed = index.removal_texts(present)
        texts: dict[str, str] = {}
        if needed:
            with self.db.session() as session:
                texts = {row.id: row.content for row in self.repo.texts_by_ids(session, needed)}
        if len(texts) < len(needed):  # a neighbour erased meanwhile: its forget follows
            return False
        index.remove(present, texts)
        return True

    def _rebuild_without(self, fleet_id: str, slot: _FleetSlot, gone: set[str], erased: int,
                         position: int, gaps: Sequence[int]) -> int:
        """Swap the fleet's index for one rebuilt from the store through ``position``; returns
        how many records left it (``erased``, and any other erased since)."""
        rebuilt = self._rebuilt(fleet_id, position, gaps)
        with slot.lock:
            with self._lock:
                slot.apply_inbox()
                old = slot.index
            later = [i for i in old.ids if i and i not in rebuilt.doc_of and i not in gone]
            self._carry_over(fleet_id, old, rebuilt, later)
            if self.previous is None:  # retired while this fleet was rebuilt
                rebuilt.drop_previous()
            slot.index = rebuilt
        log.info("fleet index rebuilt after an erasure", extra={
            "fleet_id": fleet_id, "erased": erased,
            "records": len(rebuilt), "handed_meanwhile": len(later)})
        return len(old) - len(rebuilt)

    def _carry_over(self, fleet_id: str, old: FleetIndex, rebuilt: FleetIndex,
                    later: list[str]) -> None:
        """Into ``rebuilt``: the records handed to ``old`` while it was built (in the order
        they were handed), and the vectors ``old`` received meanwhile (all are stored)."""
        if later:
            with self.db.session() as session:
                rows = {row.id: row for row in self.repo.texts_by_ids(session, later)}
            for record_id in later:
                row = rows.get(record_id)
                if row is not None:  # else erased meanwhile: the next forget drops it
                    _applied(_adder(row), rebuilt, self.change_failures)
        if self.embedder is not None:
            self._add_stored_vectors(rebuilt, [
                i for i in rebuilt.ids if rebuilt.needs_vector(i) and old.has_vector(i)])

    def _add_stored_vectors(self, index: FleetIndex, ids: list[str]) -> None:
        """The stored vectors of those of ``ids`` that have one, into ``index``."""
        assert self.embedder is not None
        self._stored_into(index, ids, self.embedder.name, index.add_vectors)

    def _add_previous_vectors(self, index: FleetIndex, ids: list[str]) -> None:
        """The previous model's stored vectors of those of ``ids`` that have one."""
        previous = self.previous
        if previous is not None:
            self._stored_into(index, ids, previous.name, index.add_previous_vectors)

    def _stored_into(self, index: FleetIndex, ids: list[str], model: str,
                     add: Callable[[list[int], np.ndarray], None]) -> None:
        """``model``'s stored vectors of those of ``ids`` that have one, handed to ``add``."""
        if not ids:
            return
        with self.db.session() as session:
            stored = self.repo.stored_vectors(session, ids, model)
        found = [i for i in stored if i in index.doc_of]  # a record left out (_applied)
        if found:
            add([index.doc_of[i] for i in found], np.stack(
                [np.frombuffer(stored[i], dtype="<f4") for i in found]).astype(np.float32))

    def _apply_erasures(self) -> None:
        """Erasures carried out since the last look, by this replica or another sharing the
        store: their records leave this replica's indexes within one poll interval."""
        now = time.monotonic()
        if now - self._tombstones_checked < self.poll_s:  # not on every catch-up of a burst
            return
        self._tombstones_checked = now
        with self.db.session() as session:
            count = self.repo.tombstone_count(session)
        if count == self._tombstones_seen:
            return
        with self.db.session() as session:
            erased = self.repo.tombstone_ids_by_fleet(session)
        for fleet_id, ids in erased.items():
            self.forget(fleet_id, ids)
        self._tombstones_seen = count

    def _rebuilt(self, fleet_id: str, position: int, gaps: Sequence[int]) -> FleetIndex:
        """The fleet's index from its stored records through ``position`` (not ``gaps``)."""
        index = self._empty_index()
        after = 0
        while True:
            with self.db.session() as session:
                rows = self.repo.fleet_texts(session, fleet_id, after, position, gaps, 5000)
            if not rows:
                break
            for row in rows:
                _applied(_adder(row), index, self.change_failures)
            after = rows[-1].seq
            if self.embedder is not None:
                self._add_stored_vectors(index, [row.id for row in rows])
                self._add_previous_vectors(index, [row.id for row in rows])
        return index

    @contextmanager
    def _fleet(self, fleet_id: str) -> Iterator[FleetIndex | None]:
        """The fleet's index, up to date and held for this thread alone (None: no records)."""
        with self._lock:
            slot = self._fleets.get(fleet_id)
        if slot is None:
            yield None
            return
        with slot.lock:
            slot.apply_inbox()
            yield slot.index

    def catch_up(self) -> int:
        """Vectors for the next batch of records (stored ones reused); returns how many."""
        self.sync()
        if self.embedder is None:  # lexical only: nothing to embed
            with self._lock:
                self._pending.clear()
            return 0
        self._queue_backfill()
        with self._handing():
            with self._lock:
                work = [self._pending.popleft()
                        for _ in range(min(self.batch, len(self._pending)))]
                self._in_flight = Counter(item[1] for item in work)
                self._to_embed_recent.extend(work)
            if not work:
                return 0
            try:
                self._index_vectors(work)
            except BaseException:  # put the batch back: a failed round must not drop records
                with self._lock:  # (but not those erased meanwhile: they would fail it again)
                    self._pending.extendleft(reversed(
                        [item for item in work if item[2] not in self._erased_recent]))
                raise
            finally:
                with self._lock:
                    self._in_flight = Counter()
        return len(work)

    def _queue_backfill(self) -> None:
        """Queue the next records a loaded snapshot holds without vectors (they are stored)."""
        after, through = self._backfill
        with self._lock:
            if after >= through or len(self._pending) >= self.batch:
                return
        with self._handing():
            with self.db.reading() as connection:
                rows = [row for row in self.repo.texts_after(connection, after, [],
                                                             self.batch * 4)
                        if row.seq <= through]
            with self._lock:
                self._pending.extendleft(reversed(
                    [(row.seq, row.fleet_id, row.id, row.content) for row in rows
                     if row.id not in self._erased_recent]))
                self._backfill = (rows[-1].seq if rows else through, through)

    def _index_vectors(self, work: list[Pending]) -> None:
        """Stored vectors are reused; the rest are embedded (outside any transaction), stored
        and added to their fleets' indexes."""
        assert self.embedder is not None
        with self.db.session() as session:
            stored = self.repo.stored_vectors(session, [item[2] for item in work],
                                              self.embedder.name)
        missing = [item for item in work if item[2] not in stored]
        if missing:
            with self._lock:  # kept (a bounded cache): dedup compares with handed records
                ready = {item[2]: self._fresh_vectors.get(item[3]) for item in missing}
            to_embed = [item for item in missing if ready[item[2]] is None]
            try:
                vectors = self.embedder.embed_background([item[3] for item in to_embed])
            except Exception:  # catch_up puts the batch back; the indexer retries it
                self.embedder_failures.add("index")
                raise
            for item, vector in zip(to_embed, vectors, strict=True):
                ready[item[2]] = vector
            with self._lock:  # erased while it was embedded: no vector to store (or hand over)
                work = [item for item in work if item[2] not in self._erased_recent]
                missing = [item for item in missing if item[2] not in self._erased_recent]
            for item in missing:
                stored[item[2]] = np.asarray(ready[item[2]]).astype("<f4").tobytes()
            with self.db.session() as session:
                self.repo.replace_vectors(session, self.embedder.name, [
                    StoredVector(record_id, fleet_id, seq, stored[record_id])
                    for seq, fleet_id, record_id, _ in missing
                ])
        by_fleet: dict[str, tuple[list[str], list[np.ndarray]]] = {}
        for _, fleet_id, record_id, _ in work:
            ids, rows = by_fleet.setdefault(fleet_id, ([], []))
            ids.append(record_id)
            rows.append(np.frombuffer(stored[record_id], dtype="<f4"))
        for fleet_id, (ids, rows) in by_fleet.items():
            with self._lock:
                slot = self._fleets[fleet_id]
                slot.inbox.append(_vector_adder(ids, np.stack(rows).astype(np.float32)))
            _apply_if_idle(slot)

    def embed_queue(self) -> int:
        """Records handed to the embedder (or queued for it) and not yet embedded."""
        with self._lock:
            return len(self._pending) + self._in_flight.total() \
                if self.embedder is not None else 0

    def lag_seconds(self, now_us: int) -> float:
        """How old the oldest committed record without a vector is (0 when caught up)."""
        if self.embedder is None:
            return 0.0
        with self._lock:  # the oldest waiting record: first in the queue, else past the cursor
            position = self._pending[0][0] - 1 if self._pending else self._cursor.position
        with self.db.session() as session:
            oldest = self.repo.created_after(session, position)
        return max(0.0, (now_us - oldest) / 1e6) if oldest is not None else 0.0

    def lag(self, fleet_id: str | None = None) -> int:
        """Committed records not yet in the vector index (0 when caught up or lexical only):
        of ``fleet_id`` (what its GetStatus shows), or of every fleet (the replica's metric). A
        fleet's count says nothing of other fleets' writes."""
        if self.embedder is None:
            return 0
        with self._lock:
            if fleet_id is None:
                waiting = len(self._pending) + self._in_flight.total()
            else:
                waiting = sum(1 for item in self._pending if item[1] == fleet_id) + \
                    self._in_flight[fleet_id]
            position = self._cursor.position
            after, through = self._backfill
        repo = self.repo
        with self.db.session() as session:
            backfill = (repo.count_through(session, through, [], fleet_id)
                        - repo.count_through(session, after, [], fleet_id)) \
                if after < through else 0
            return waiting + backfill + repo.count_after(session, position, fleet_id)

    # -- queries ------------------------------------------------------------

    def embed_query(self, text: str) -> np.ndarray:
        if self.embedder is None:
            raise RuntimeError("this index runs without an embedding provider")
        vector: np.ndarray = self.embedder.embed([text])[0]
        return vector

    def search(
        self,
        fleet_id: str,
        text: str,
        mode: str,
        *,
        run_id: str | None = None,
        query_vector: np.ndarray | None = None,
        doc_filter: DocFilter | None = None,
    ) -> list[tuple[str, float]]:
        """(record id, relevance) candidates of one fleet, best first (lexical | semantic |
        hybrid); without an embedding provider every mode is lexical. ``doc_filter`` (or
        ``run_id`` alone) restricts the candidates before they are scored.

        The query is embedded while this thread catches up and scores BM25, so hybrid pays
        max(embed, lexical), not the sum: sent to the embedder process from this thread and
        read back when the scoring needs it (``_start_query``), or, for an in-process or
        remote model, embedded on a pool thread (ONNX Runtime releases the GIL).
        """
        self.require_ready()
        if self.embedder is None:
            mode = "lexical"
        vector: np.ndarray | Callable[[], np.ndarray | None] | None = None
        previous_vector: Callable[[], np.ndarray | None] | None = None
        settle: Callable[[], None] = _nothing
        if mode != "lexical":
            if query_vector is not None:
                vector = query_vector
            else:
                pending, settle = self._start_query(text)
                vector = (_lexical_if_unavailable(pending, self.embedder_failures)
                          if mode == "hybrid" else pending)
            previous = self.previous
            if previous is not None and query_vector is None and self._holds_previous(fleet_id):
                previous_vector = self._query_pool.submit(_previous_query, previous, text).result
        try:
            self.sync()
            with self._fleet(fleet_id) as index:
                if index is None:
                    return []
                flt = doc_filter if doc_filter is not None else DocFilter(run_id=run_id)
                allowed = index.mask(flt)
                if allowed is not None and not allowed.any():
                    return []
                found = index.search(text, vector, mode, allowed, previous_vector)
                return [(index.ids[doc], score) for doc, score in found]
        finally:
            settle()  # a query vector nobody asked for (no candidates): free its pipe

    def _start_query(self, text: str) -> tuple[Callable[[], np.ndarray], Callable[[], None]]:
        """The query's embedding, begun: (its vector when called, what ends it unasked).

        The embedder process (``embed_started``) gets the text from this thread at once: a
        pool thread in between would have to take the GIL from this one, busy scoring BM25,
        to send it, and again to hand the reply over (measured at 10k records: see
        docs/retrieval.md). Other providers embed on the query pool."""
        assert self.embedder is not None
        started = getattr(self.embedder, "embed_started", None)
        if started is None:
            return self._query_pool.submit(self.embed_query, text).result, _nothing
        try:
            pending = started([text])
        except Unavailable as error:  # no child could start: raised where the vector is read
            failure = error

            def failed() -> np.ndarray:
                raise failure

            return failed, _nothing

        def first_row() -> np.ndarray:
            row: np.ndarray = pending()[0]
            return row

        return first_row, pending.settle

    def nearest(self, fleet_id: str, text: str, k: int) -> list[tuple[str, float]]:
        """Plain cosine nearest neighbours (no context), e.g. for duplicate detection."""
        return self.nearest_vector(fleet_id, self.embed_query(text), k)

    def nearest_vector(self, fleet_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        with self._fleet(fleet_id) as index:
            if index is None:
                return []
            return [(index.ids[d], sim) for d, sim in index.vectors.search(vector, k)]

    def duplicates(
        self,
        fleet_id: str,
        agent_id: str,
        texts: list[str],
        run_ids: list[str],
        *,
        semantic: bool,
        threshold: float,
    ) -> list[Duplicate | None]:
        """For each of ``agent_id``'s texts, what it duplicates: stored records, an earlier
        text of the batch, or nothing (None).

        Exact: the same normalised text (case and spacing) by the same author in the same run
        of the fleet, checked against every committed record (the lexical cursor is advanced
        first). Semantic: additionally the records at cosine >= ``threshold`` among the
        nearest in the vector index (any author's: the caller keeps its own); the new texts
        are embedded here, once, and their vectors kept for the indexer. Earlier texts of
        the same batch count as existing.
        """
        self.require_ready()
        self.sync()
        keys = [text_key(t, run, agent_id) for t, run in zip(texts, run_ids, strict=True)]
        vectors = self.embedder.embed(texts) if semantic and self.embedder is not None else None
        out: list[Duplicate | None] = []
        with self._fleet(fleet_id) as index:
            seen: dict[bytes, int] = {}
            for i, key in enumerate(keys):
                stored = index.text_keys.get(key) if index is not None else None
                found: Duplicate | None = (StoredDuplicate((stored,)) if stored is not None
                                           else None)
                if found is None and key in seen:
                    found = BatchDuplicate(seen[key])
                if found is None and vectors is not None:
                    found = self._near(index, vectors, i, threshold) or self._near_pending(
                        fleet_id, vectors[i], threshold
                    )
                seen.setdefault(key, i)
                out.append(found)
        if vectors is not None:
            with self._lock:
                for text, vector in zip(texts, vectors, strict=True):
                    self._fresh_vectors[text] = vector
                while len(self._fresh_vectors) > 10_000:
                    self._fresh_vectors.pop(next(iter(self._fresh_vectors)))
        return out

    def _near(
        self, index: FleetIndex | None, vectors: np.ndarray, i: int, threshold: float
    ) -> Duplicate | None:
        if index is not None and len(index.vectors):
            near = [index.ids[doc] for doc, similarity in
                    index.vectors.search(vectors[i], _NEAR_CANDIDATES) if similarity >= threshold]
            if near:
                return StoredDuplicate(tuple(near))
        for j in range(i):  # an earlier text of the same batch
            if float(vectors[j] @ vectors[i]) >= threshold:
                return BatchDuplicate(j)
        return None

    def _near_pending(
        self, fleet_id: str, vector: np.ndarray, threshold: float
    ) -> StoredDuplicate | None:
        """Committed records whose vector (embedded at write) may not be in the index yet: those
        queued, and the last handed to the embedder (between its hand-over and the fleet's
        next read of its inbox a record is in neither queue nor index: a near duplicate
        written then was stored twice, seen under load in CI)."""
        with self._lock:
            recent = [*itertools.islice(reversed(self._pending), _NEAR_PENDING),
                      *reversed(self._to_embed_recent)]
            fresh = [self._fresh_vectors.get(text) if fleet == fleet_id else None
                     for _, fleet, _, text in recent]
        near = []
        for (_, _, record_id, _), pending in zip(recent, fresh, strict=True):
            if pending is not None and float(pending @ vector) >= threshold:
                near.append(record_id)
        return StoredDuplicate(tuple(near[:_NEAR_CANDIDATES])) if near else None

    def indexed(self, fleet_id: str) -> int:
        with self._fleet(fleet_id) as index:
            return index.indexed_vectors() if index is not None else 0


def _adder(row: RecordText) -> FleetChange:
    """Add one stored record to a fleet's index (in ``seq`` order)."""
    key = text_key(row.content, row.run_id, row.agent_id)
    day = metadata_day(row.metadata, row.created_us)
    facts = DocFacts(row.agent_id, row.domain, row.tags, row.metadata, row.created_us,
                     row.importance)

    def add(index: FleetIndex) -> None:
        index.add(row.id, row.run_id, row.content, key, day, facts)

    add.record_id = row.id  # type: ignore[attr-defined]  # named in the log if it fails
    return add


def _vector_adder(record_ids: list[str], vectors: np.ndarray) -> FleetChange:
    def add(index: FleetIndex) -> None:
        known = [i for i, r in enumerate(record_ids) if r in index.doc_of]  # not erased since
        if known:
            index.add_vectors([index.doc_of[record_ids[i]] for i in known], vectors[known])

    add.record_id = (record_ids[0] if len(record_ids) == 1 else  # type: ignore[attr-defined]
                     f"{record_ids[0]} and {len(record_ids) - 1} more" if record_ids else "")
    return add


def _apply_if_idle(slot: _FleetSlot) -> None:
    """Apply a fleet's inbox now unless someone holds it (they apply it): never wait."""
    if slot.lock.acquire(blocking=False):
        try:
            slot.apply_inbox()
        finally:
            slot.lock.release()


def text_key(text: str, run_id: str, agent_id: str) -> bytes:
    """Duplicates are judged within one author's run: a run's snapshot must hold what it
    wrote, and one author's write is never answered with another's record."""
    material = f"{agent_id}\x1f{run_id}\x1f{normalised_text(text)}"
    return hashlib.blake2b(material.encode(), digest_size=16).digest()


def normalised_text(text: str) -> str:
    """Case and spacing do not make a different memory; signs and punctuation may ("-5", "C++")."""
    return " ".join(text.lower().split())
