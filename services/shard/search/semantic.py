"""SemanticIndex: record vectors in the database, a per-fleet vector index in memory.

One background indexer follows the records table by ``seq``: for each new
record it loads the stored vector (written by this or another replica) or
embeds the content and stores it, then adds it to the fleet's index. The same
loop rebuilds the index at start, so it is correct across restarts and
replicas; a write only wakes it (writes never wait for the model).
``lag()`` is the number of committed records not yet searchable semantically.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
from sqlalchemy import BigInteger, LargeBinary, String, func, select
from sqlalchemy.orm import Mapped, mapped_column

from services.common.db import Database
from services.shard.retrieval.embedding import EmbeddingProvider
from services.shard.retrieval.vector_index import TieredVectorIndex
from services.shard.tables import Base, RecordRow

log = logging.getLogger("engram.shard.semantic")


class RecordVectorRow(Base):
    __tablename__ = "record_vectors"

    record_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))
    record_seq: Mapped[int] = mapped_column(BigInteger)
    model: Mapped[str] = mapped_column(String(64))
    vector: Mapped[bytes] = mapped_column(LargeBinary)


class SemanticIndex:
    def __init__(
        self,
        database: Database,
        embedder: EmbeddingProvider,
        *,
        batch: int = 64,
        poll_s: float = 0.5,
        hnsw_threshold: int = 10_000,
    ) -> None:
        self.db = database
        self.embedder = embedder
        self.batch = batch
        self.poll_s = poll_s
        self.hnsw_threshold = hnsw_threshold
        self._indexes: dict[str, TieredVectorIndex] = {}
        self._keys: dict[str, list[str]] = {}  # fleet -> record id by index key
        self._seq_done = 0
        self._seq_seen = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="semantic-indexer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def notify(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                while self.catch_up() and not self._stop.is_set():
                    pass
            except Exception:  # the loop must survive a transient database error
                log.exception("semantic indexing failed; retrying")
            self._wake.wait(self.poll_s)
            self._wake.clear()

    # -- indexing -----------------------------------------------------------

    def catch_up(self) -> int:
        """Index the next batch of records after the last indexed seq; returns how many."""
        with self.db.session() as session:
            rows = session.execute(
                select(RecordRow.seq, RecordRow.id, RecordRow.fleet_id, RecordRow.content)
                .where(RecordRow.seq > self._seq_done)
                .order_by(RecordRow.seq)
                .limit(self.batch)
            ).all()
            self._seq_seen = int(session.execute(select(func.max(RecordRow.seq))).scalar() or 0)
            if not rows:
                return 0
            stored = {
                r.record_id: r.vector
                for r in session.execute(
                    select(RecordVectorRow.record_id, RecordVectorRow.vector).where(
                        RecordVectorRow.record_id.in_([row.id for row in rows]),
                        RecordVectorRow.model == self.embedder.name,
                    )
                )
            }
            missing = [row for row in rows if row.id not in stored]
            if missing:
                vectors = self.embedder.embed([row.content for row in missing])
                for row, vector in zip(missing, vectors, strict=True):
                    stored[row.id] = vector.astype("<f4").tobytes()
                session.execute(
                    RecordVectorRow.__table__.delete().where(  # type: ignore[attr-defined]
                        RecordVectorRow.record_id.in_([row.id for row in missing])
                    )
                )
                session.add_all(
                    RecordVectorRow(
                        record_id=row.id,
                        fleet_id=row.fleet_id,
                        record_seq=row.seq,
                        model=self.embedder.name,
                        vector=stored[row.id],
                    )
                    for row in missing
                )
        with self._lock:
            for row in rows:
                vector = np.frombuffer(stored[row.id], dtype="<f4").astype(np.float32)
                index = self._indexes.get(row.fleet_id)
                if index is None:
                    index = TieredVectorIndex(
                        self.embedder.dimension, threshold=self.hnsw_threshold
                    )
                    self._indexes[row.fleet_id] = index
                    self._keys[row.fleet_id] = []
                keys = self._keys[row.fleet_id]
                index.add([len(keys)], vector[None, :])
                keys.append(row.id)
            self._seq_done = int(rows[-1].seq)
        return len(rows)

    def lag(self) -> int:
        """Committed records not yet in the vector index (0 when caught up)."""
        with self.db.session() as session:
            return int(
                session.execute(
                    select(func.count())
                    .select_from(RecordRow)
                    .where(RecordRow.seq > self._seq_done)
                ).scalar()
                or 0
            )

    # -- queries ------------------------------------------------------------

    def embed_query(self, text: str) -> np.ndarray:
        vector: np.ndarray = self.embedder.embed([text])[0]
        return vector

    def search(self, fleet_id: str, query_vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        with self._lock:
            index = self._indexes.get(fleet_id)
            if index is None:
                return []
            keys = self._keys[fleet_id]
            return [(keys[key], score) for key, score in index.search(query_vector, k)]

    def nearest(self, fleet_id: str, text: str, k: int) -> list[tuple[str, float]]:
        return self.search(fleet_id, self.embed_query(text), k)

    def indexed(self, fleet_id: str) -> int:
        with self._lock:
            return len(self._keys.get(fleet_id, ()))
