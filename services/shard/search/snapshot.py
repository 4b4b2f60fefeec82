"""IndexSnapshot: the lexical search index saved to a file, so a restart loads it instead of
re-reading and re-analysing every record.

File: a magic line, one line of JSON (the header), then the payload: one frame per fleet
(the fleet id and its index, pickled on its own, each length-prefixed), so a save holds one
fleet at a time, never the whole index. The header says what the payload covers at least:
the records cursor (``position`` and its ``gaps``), how many records that is and the id of
the last one; a fleet may hold records committed after that (it was pickled later), which
the load reads again and skips by id. It also gives the analyser's settings and the
payload's length and SHA-256. :func:`read_snapshot` refuses a file whose
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
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("engram.shard.index")

MAGIC = b"ENGRAM-SHARD-LEXICAL-INDEX\n"
FORMAT = 4
"""Raised whenever what the payload holds or how text is analysed changes."""
READABLE = (3, 4)
"""Format 3 lacks what erasure in place needs (holes, later text-key holders): loaded, its
fleets are rebuilt at their first erasure instead (``FleetIndex.in_place_allowed``)."""


@dataclass(frozen=True)
class SnapshotHeader:
    format: int
    position: int
    """The highest records ``seq`` the index holds."""
    gaps: list[int]
    """Seqs at or below ``position`` not committed when it was saved (read again on load)."""
    records: int
    """Records with ``seq <= position``, minus ``gaps``: the payload holds these at least."""
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


Frame = tuple[str, bytes]
"""One fleet in the payload: its id and its index, pickled."""

_FRAME = struct.Struct(">IQ")  # fleet id bytes, pickle bytes


class _PickleOut(io.BytesIO):
    """Where :func:`fleet_frame` pickles to. Its ``write`` is Python code, which the pickler
    calls at the end of each 64 KB frame: a thread waiting for the interpreter lock gets it
    there. ``pickle.dumps`` is one C call that held it for a whole fleet's dict of ids
    (about 0.1 s per 100k records) while every other fleet's searches waited."""

    def write(self, data: Any) -> int:
        return super().write(data)


def fleet_frame(fleet_id: str, index: Any) -> Frame:
    """The fleet's frame. ``index`` is pickled outside the fleet's lock (a private copy,
    :meth:`FleetIndex.snapshot_copy`), so other threads run meanwhile."""
    out = _PickleOut()
    pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(index)
    return fleet_id, out.getvalue()


def _frame_parts(frames: Iterable[Frame]) -> Iterable[bytes]:
    for fleet_id, blob in frames:
        name = fleet_id.encode()
        yield _FRAME.pack(len(name), len(blob))
        yield name
        yield blob


def temporary_of(path: Path) -> Path:
    """Where a save writes before it replaces ``path``."""
    return path.with_name(path.name + ".tmp")


def write_snapshot(path: Path, header: SnapshotHeader, frames: list[Frame]) -> None:
    """Atomically replace ``path``: a reader sees the old file or the new one, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_of(path)
    try:
        with temporary.open("wb") as out:
            out.write(MAGIC)
            out.write(json.dumps(asdict(header), sort_keys=True).encode() + b"\n")
            for part in _frame_parts(frames):
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:  # a full disk: no half-written copy left behind to hold old terms
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def header_for(frames: list[Frame], *, position: int, gaps: list[int], records: int,
               last_id: str, settings: str) -> SnapshotHeader:
    digest = hashlib.sha256()
    size = 0
    for part in _frame_parts(frames):
        digest.update(part)
        size += len(part)
    return SnapshotHeader(FORMAT, position, gaps, records, last_id, settings, size,
                          digest.hexdigest())


def _unframe(payload: memoryview) -> dict[str, Any]:
    fleets: dict[str, Any] = {}
    at = 0
    while at < len(payload):
        if len(payload) - at < _FRAME.size:
            raise SnapshotRejected("a fleet's frame is cut off")
        name_bytes, blob_bytes = _FRAME.unpack_from(payload, at)
        at += _FRAME.size
        if at + name_bytes + blob_bytes > len(payload):
            raise SnapshotRejected("a fleet's frame runs past the payload")
        fleet_id = bytes(payload[at:at + name_bytes]).decode()
        at += name_bytes
        if fleet_id in fleets:
            raise SnapshotRejected(f"fleet {fleet_id!r} is framed twice")
        fleets[fleet_id] = _IndexUnpickler(io.BytesIO(payload[at:at + blob_bytes])).load()
        at += blob_bytes
    return fleets


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
    if header.format not in READABLE:
        raise SnapshotRejected(f"format {header.format}, this shard reads {READABLE}")
    if header.settings != settings:
        raise SnapshotRejected("saved with other analyser settings")
    payload = memoryview(data)[end + 1:]
    if len(payload) != header.payload_bytes:
        raise SnapshotRejected(f"payload is {len(payload)} bytes, the header says "
                               f"{header.payload_bytes}")
    if hashlib.sha256(payload).hexdigest() != header.payload_sha256:
        raise SnapshotRejected("the payload does not match its SHA-256 (damaged)")
    try:
        fleets = _unframe(payload)
    except SnapshotRejected:
        raise
    except Exception as error:  # a payload that hashes right but does not load: rebuild
        raise SnapshotRejected(f"the payload does not load: {error}") from error
    return header, fleets
