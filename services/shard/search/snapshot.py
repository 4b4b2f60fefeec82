"""IndexSnapshot: the lexical search index saved to a file, so a restart loads it instead of
re-reading and re-analysing every record.

File: a magic line, one line of JSON (the header), then the payload (the fleets' indexes,
pickled). The header says what the payload covers: the records cursor (``position`` and
its ``gaps``), how many records that is and the id of the last one, the analyser's
settings, and the payload's length and SHA-256. :func:`read_snapshot` refuses a file whose
payload does not hash to its header; the caller then checks the header against the store
(:meth:`SearchIndex.warm_up`) and rebuilds on any difference, so a damaged or stale file
costs a rebuild, never a wrong answer. The payload is unpickled by an unpickler that builds
only the index's own classes and numpy arrays (no other callable), and the file lives in
the shard's data directory beside its database, written by the shard alone: temp file,
fsync, rename, fsync of the directory.

Vectors are not saved: they are stored in the database already (``record_vectors``) and
loaded back by the indexer after a restart, without embedding again.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("engram.shard.index")

MAGIC = b"ENGRAM-SHARD-LEXICAL-INDEX\n"
FORMAT = 2
"""Raised whenever what the payload holds or how text is analysed changes."""


@dataclass(frozen=True)
class SnapshotHeader:
    format: int
    position: int
    """The highest records ``seq`` the index holds."""
    gaps: list[int]
    """Seqs at or below ``position`` not committed when it was saved (read again on load)."""
    records: int
    """Records the index holds: those with ``seq <= position``, minus ``gaps``."""
    last_id: str
    """The id of the record at ``position`` ("" when there is none)."""
    settings: str
    """The analyser's settings (BM25 and context weights): another setting rebuilds."""
    payload_bytes: int
    payload_sha256: str


class SnapshotRejected(Exception):
    """The file cannot be used; the message says why (the caller rebuilds)."""


_ALLOWED = {
    ("services.shard.search.fleet_index", "FleetIndex"),
    ("services.shard.search.fleet_index", "ContextSettings"),
    ("services.shard.retrieval.lexical", "GrowingBM25"),
    ("services.shard.retrieval.lexical", "_Postings"),
    ("collections", "OrderedDict"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class _IndexUnpickler(pickle.Unpickler):
    """Builds the index's classes and numpy arrays, nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise SnapshotRejected(f"the payload names {module}.{name}, which an index "
                                   "snapshot never holds")
        return super().find_class(module, name)


def write_snapshot(path: Path, header: SnapshotHeader, payload: bytes) -> None:
    """Atomically replace ``path``: a reader sees the old file or the new one, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as out:
        out.write(MAGIC)
        out.write(json.dumps(asdict(header), sort_keys=True).encode() + b"\n")
        out.write(payload)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def payload_of(fleets: dict[str, Any]) -> bytes:
    return pickle.dumps(fleets, protocol=pickle.HIGHEST_PROTOCOL)


def header_for(payload: bytes, *, position: int, gaps: list[int], records: int,
               last_id: str, settings: str) -> SnapshotHeader:
    return SnapshotHeader(FORMAT, position, gaps, records, last_id, settings, len(payload),
                          hashlib.sha256(payload).hexdigest())


def read_snapshot(path: Path, settings: str) -> tuple[SnapshotHeader, dict[str, Any]]:
    """The header and the fleets' indexes; :class:`SnapshotRejected` when the file is not a
    whole snapshot of this format and these settings."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SnapshotRejected(f"cannot read {path}: {error}") from error
    if not data.startswith(MAGIC):
        raise SnapshotRejected("not an index snapshot (wrong magic line)")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise SnapshotRejected("the header is cut off")
    try:
        fields = json.loads(data[len(MAGIC):end])
        header = SnapshotHeader(**fields)
    except (ValueError, TypeError) as error:
        raise SnapshotRejected(f"the header does not parse: {error}") from error
    if header.format != FORMAT:
        raise SnapshotRejected(f"format {header.format}, this shard reads {FORMAT}")
    if header.settings != settings:
        raise SnapshotRejected("saved with other analyser settings")
    payload = memoryview(data)[end + 1:]
    if len(payload) != header.payload_bytes:
        raise SnapshotRejected(f"payload is {len(payload)} bytes, the header says "
                               f"{header.payload_bytes}")
    if hashlib.sha256(payload).hexdigest() != header.payload_sha256:
        raise SnapshotRejected("the payload does not match its SHA-256 (damaged)")
    try:
        fleets = _IndexUnpickler(io.BytesIO(payload)).load()
    except SnapshotRejected:
        raise
    except Exception as error:  # a payload that hashes right but does not load: rebuild
        raise SnapshotRejected(f"the payload does not load: {error}") from error
    if not isinstance(fleets, dict):
        raise SnapshotRejected("the payload is not a table of fleets")
    return header, fleets
