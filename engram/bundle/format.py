"""The bundle file: a POSIX tar of canonical JSON-lines parts and blobs, manifest last.

A bundle holds one fleet's state as ``parts/<kind>.jsonl`` (one canonical JSON object a
line, one part per kind: records, domains, runs, events, ...) and ``blobs/<sha256>`` (artifact
contents), then ``MANIFEST.json``: every member's path, size, SHA-256 and row count, and a
``content_digest`` over those entries that depends on nothing but the content (no time, no
tar header), so exporting the same state twice gives the same digest.

Both sides stream. The writer spools each member to a temporary file past ``SPOOL_BYTES``
(tar needs a member's size before its bytes) and writes ``<out>.partial``, renamed to
``<out>`` only once the manifest is in, so a bundle that exists is a complete one. The reader
checks every member against the manifest before anything is read out of it
(:meth:`BundleReader.verify`) and names each problem: altered, missing, added, repeated, or
outside the bundle (an absolute path, ``..``, a link or a device).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, NamedTuple, Self

from google.protobuf.json_format import ParseDict, ParseError

from engram.compactor.v1 import compactor_service_pb2 as cpb

FORMAT = "engram-bundle/2"
FORMAT_1 = "engram-bundle/1"
"""Bundles written before 2026-11-29: their ``content_digest`` covers the members only, not
the fleet and run the manifest names (a copy relabelled to another fleet kept its digest)."""
READABLE = (FORMAT_1, FORMAT)
MANIFEST_PATH = "MANIFEST.json"
SPOOL_BYTES = 8 * 1024 * 1024
"""A member up to this size is spooled in memory; a larger one goes to a temporary file."""
CHUNK = 1024 * 1024
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
MANIFEST_BASE_BYTES = 64 * 1024
MANIFEST_BYTES_PER_MEMBER = 1024
"""A manifest's entry is about 200 bytes (path, SHA-256, size, rows): at most this much a
member of the bundle, and ``MANIFEST_BASE_BYTES`` more, is read (never over
``MAX_MANIFEST_BYTES``)."""
MAX_LINE_BYTES = 64 * 1024 * 1024
"""A part's line (one item) may not exceed this; the services' own messages are smaller."""
MAX_HEADER_BYTES = 64 * 1024
"""A pax extended header or GNU long name may not exceed this (the writer makes none, or a
few bytes for a blob over 8 GiB); tarfile would read it whole into memory."""
MAX_MEMBERS = 2_000_000
"""A bundle may not have more tar members than this (a 256 MiB manifest lists fewer)."""


class BundleError(Exception):
    """A bundle that cannot be written or read as it is; ``problems`` names each fault."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        detail = "; ".join(self.problems[:20])
        more = f" (and {len(self.problems) - 20} more)" if len(self.problems) > 20 else ""
        super().__init__(f"{message}: {detail}{more}" if self.problems else message)


def canonical_line(value: Any) -> bytes:
    """One part line: keys sorted, no whitespace, UTF-8 as is, no NaN; newline-terminated."""
    return (json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                       allow_nan=False) + "\n").encode()


def part_path(kind: str) -> str:
    if not kind or not all(c.isalnum() or c in "_-" for c in kind):
        raise ValueError(f"part kind {kind!r} must be letters, digits, '_' or '-'")
    return f"parts/{kind}.jsonl"


def blob_path(sha256: str) -> str:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"blob name {sha256!r} is not a lowercase hex SHA-256")
    return f"blobs/{sha256}"


@dataclass(frozen=True)
class Member:
    """One manifest entry: a member's path, size, SHA-256 and (for a part) its line count."""

    path: str
    size: int
    sha256: str
    rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"path": self.path, "sha256": self.sha256, "size": self.size}
        if self.rows is not None:
            entry["rows"] = self.rows
        return entry


@dataclass
class Manifest:
    """What a bundle holds; ``content_digest`` is a pure function of the members."""

    fleet_id: str
    run_id: str = ""
    members: list[Member] = field(default_factory=list)
    format: str = FORMAT

    @property
    def content_digest(self) -> str:
        digest = hashlib.sha256(self.format.encode() + b"\n")
        if self.format != FORMAT_1:  # the fleet and run it is of are part of what it says
            digest.update(canonical_line({"fleet_id": self.fleet_id, "run_id": self.run_id}))
        for member in sorted(self.members, key=lambda m: m.path):
            digest.update(canonical_line(member.to_dict()))
        return digest.hexdigest()

    def member(self, path: str) -> Member | None:
        return next((m for m in self.members if m.path == path), None)

    def rows(self, kind: str) -> int:
        found = self.member(part_path(kind))
        return found.rows or 0 if found else 0

    def to_bytes(self) -> bytes:
        return json.dumps({
            "format": self.format, "fleet_id": self.fleet_id, "run_id": self.run_id,
            "members": [m.to_dict() for m in sorted(self.members, key=lambda m: m.path)],
            "content_digest": self.content_digest,
        }, sort_keys=True, indent=1, ensure_ascii=False).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        try:
            document = json.loads(data)
            if document.get("format") not in READABLE:
                raise BundleError(f"{MANIFEST_PATH} is format {document.get('format')!r}, "
                                  f"this engram reads {' and '.join(map(repr, READABLE))}")
            manifest = cls(fleet_id=str(document["fleet_id"]), run_id=str(document["run_id"]),
                           format=str(document["format"]),
                           members=[Member(path=str(m["path"]), size=int(m["size"]),
                                           sha256=str(m["sha256"]),
                                           rows=None if m.get("rows") is None else int(m["rows"]))
                                    for m in document["members"]])
            claimed = str(document["content_digest"])
        except BundleError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            raise BundleError(f"{MANIFEST_PATH} is not a bundle manifest ({error!r})") from None
        if claimed != manifest.content_digest:
            raise BundleError(f"{MANIFEST_PATH} was altered: its content_digest {claimed[:16]}… "
                              f"does not match its members ({manifest.content_digest[:16]}…)")
        return manifest


class _Spool:
    """A member being written: bytes spooled (memory, then disk), hashed, counted."""

    def __init__(self, spool_dir: str | None) -> None:
        self.file: IO[bytes] = tempfile.SpooledTemporaryFile(  # noqa: SIM115 - closed on add
            max_size=SPOOL_BYTES, dir=spool_dir)
        self.hash = hashlib.sha256()
        self.size = 0
        self.rows = 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.hash.update(data)
        self.size += len(data)


class PartWriter:
    """Appends rows to one part; given by :meth:`BundleWriter.part`."""

    def __init__(self, spool: _Spool) -> None:
        self._spool = spool

    def write(self, row: dict[str, Any]) -> None:
        self._spool.write(canonical_line(row))
        self._spool.rows += 1

    @property
    def rows(self) -> int:
        return self._spool.rows


class BundleWriter:
    """``with BundleWriter(out, fleet_id) as bundle: ...``: ``<out>`` appears only complete.

    Parts may be written in any order but each once; the manifest is written by ``close``.
    An exception inside the ``with`` removes ``<out>.partial`` and leaves ``<out>`` alone.
    """

    def __init__(self, out: Path, fleet_id: str, run_id: str = "") -> None:
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.manifest = Manifest(fleet_id=fleet_id, run_id=run_id)
        self._spool_dir = str(self.out.parent)
        self._tar = tarfile.open(  # noqa: SIM115 - closed by close() or abort()
            self.partial, "w", format=tarfile.PAX_FORMAT)
        self._paths: set[str] = set()
        self._members: dict[str, Member] = {}
        self.bytes_written = 0

    def part(self, kind: str) -> _PartContext:
        return _PartContext(self, part_path(kind))

    def add_blob(self, sha256: str, source: IO[bytes] | Iterator[bytes]) -> Member:
        """Copies a blob in (a file or chunks); its SHA-256 must be ``sha256``."""
        path = blob_path(sha256)
        if path in self._paths:
            return self._members[path]
        spool = _Spool(self._spool_dir)
        chunks = iter(lambda: source.read(CHUNK), b"") if hasattr(source, "read") else source
        for chunk in chunks:
            spool.write(chunk)
        if spool.hash.hexdigest() != sha256:
            spool.file.close()
            raise BundleError(f"blob {sha256[:16]}… read back with SHA-256 "
                              f"{spool.hash.hexdigest()[:16]}…: not written to the bundle")
        return self._add(path, spool, rows=None)

    def has_blob(self, sha256: str) -> bool:
        return blob_path(sha256) in self._paths

    def _add(self, path: str, spool: _Spool, rows: int | None) -> Member:
        if path in self._paths:
            raise BundleError(f"{path} written twice")
        info = tarfile.TarInfo(path)
        info.size, info.mtime, info.mode = spool.size, 0, 0o644
        spool.file.seek(0)
        self._tar.addfile(info, spool.file)
        spool.file.close()
        member = Member(path=path, size=spool.size, sha256=spool.hash.hexdigest(), rows=rows)
        self.manifest.members.append(member)
        self._paths.add(path)
        self._members[path] = member
        self.bytes_written += spool.size
        return member

    def close(self) -> Manifest:
        data = self.manifest.to_bytes()
        info = tarfile.TarInfo(MANIFEST_PATH)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        self._tar.addfile(info, io.BytesIO(data))
        self._tar.close()
        with open(self.partial, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(self.partial, self.out)
        directory = os.open(self.out.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)
        return self.manifest

    def abort(self) -> None:
        try:
            self._tar.close()  # on a full disk this fails too (it flushes the end blocks)
        except OSError:
            pass  # the partial file goes anyway
        finally:
            self.partial.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class _PartContext:
    def __init__(self, writer: BundleWriter, path: str) -> None:
        self._writer, self._path = writer, path
        self._spool = _Spool(writer._spool_dir)

    def __enter__(self) -> PartWriter:
        if self._path in self._writer._paths:
            raise BundleError(f"{self._path} written twice")
        return PartWriter(self._spool)

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self._writer._add(self._path, self._spool, rows=self._spool.rows)
        else:
            self._spool.file.close()


def _outside(info: tarfile.TarInfo) -> str | None:
    """Why a tar member may not be in a bundle, or None."""
    name = info.name
    if info.issparse() or any(key.startswith("GNU.sparse.") for key in info.pax_headers):
        # Its holes read as zeros the file does not hold: a few bytes could claim a petabyte.
        return "is a sparse member (no bundle has one)"
    pure = PurePosixPath(name)
    if name.startswith("/") or pure.is_absolute() or "\\" in name or ":" in pure.parts[0]:
        return "is an absolute path, outside the bundle"
    if any(part in ("..", ".", "") for part in name.split("/")):
        return "climbs out of the bundle ('..' or an empty or '.' component)"
    if not info.isreg():
        return "is not a regular file (a link, directory or device)"
    return None


class _Entry(NamedTuple):
    """What the reader keeps of a tar member: tarfile's own ``TarInfo`` (kept for every member
    by tarfile too) holds its pax headers, up to 64 KiB each, so a bundle of many members
    held hundreds of MB before a byte was verified."""

    name: str
    size: int
    offset_data: int
    outside: str | None
    """Why it may not be in a bundle (:func:`_outside`), or None."""

    def tarinfo(self) -> tarfile.TarInfo:
        info = tarfile.TarInfo(self.name)
        info.size, info.offset_data, info.type = self.size, self.offset_data, tarfile.REGTYPE
        return info


class _Refused(Exception):
    """A tar header no bundle has, refused before tarfile reads it."""


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses, before reading it, an extended header over
    ``MAX_HEADER_BYTES`` and any global pax header (tarfile reads a header's whole body into
    memory, and copies global values onto every later member)."""

    def _proc_pax(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.XGLTYPE:
            raise _Refused("it has a global pax header (no bundle has one)")
        if self.size > MAX_HEADER_BYTES:
            raise _Refused(f"a pax extended header of {self.size} bytes, over the "
                           f"{MAX_HEADER_BYTES} a bundle's may have")
        return super()._proc_pax(tar)  # type: ignore[misc, no-any-return]

    def _proc_gnulong(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.size > MAX_HEADER_BYTES:
            raise _Refused(f"a GNU long name of {self.size} bytes, over the "
                           f"{MAX_HEADER_BYTES} a bundle's may have")
        return super()._proc_gnulong(tar)  # type: ignore[misc, no-any-return]


class BundleReader:
    """Reads a bundle; nothing comes out of it before :meth:`verify` has passed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._infos: list[_Entry] = []
        try:
            self._tar = tarfile.open(  # noqa: SIM115 - closed by close()
                self.path, "r:", tarinfo=_BoundedTarInfo)
        except _Refused as error:
            raise BundleError(f"{self.path} is refused: {error}") from None
        except (tarfile.TarError, OSError, RecursionError) as error:
            raise BundleError(f"{self.path} is not a readable bundle ({error})") from None
        try:
            while (info := self._tar.next()) is not None:
                if len(self._infos) >= MAX_MEMBERS:
                    raise _Refused(f"it has more than {MAX_MEMBERS} members")
                self._infos.append(_Entry(info.name, info.size, info.offset_data,
                                          _outside(info)))
                # tarfile keeps every TarInfo it reads in this list (not in its typing stubs)
                self._tar.members.clear()  # type: ignore[attr-defined]
        except (_Refused, tarfile.TarError, OSError, RecursionError) as error:
            self._tar.close()
            reason = "is refused:" if isinstance(error, _Refused) else "is not a readable bundle:"
            raise BundleError(f"{self.path} {reason} {error}") from None
        self._index: dict[str, _Entry] = {}
        self.manifest: Manifest | None = None

    def payload_bytes(self) -> int:
        """The bytes :meth:`verify` will hash (every member but the manifest)."""
        return sum(i.size for i in self._infos if i.name != MANIFEST_PATH and not i.outside)

    def verify(self, progress: Any = None, expect_digest: str = "") -> Manifest:
        """Hashes every member and compares it with the manifest; raises ``BundleError`` naming
        every altered, missing, added, repeated or outside member. ``progress(n_bytes)`` is
        called as bytes are hashed. With ``expect_digest``, a manifest whose digest is another
        is refused before a member is hashed."""
        problems: list[str] = []
        seen: dict[str, _Entry] = {}
        for info in self._infos:
            why = info.outside
            if why:
                problems.append(f"{info.name!r} {why}")
            elif info.name in seen:
                problems.append(f"{info.name} is repeated in the bundle")
            else:
                seen[info.name] = info
        manifest_info = seen.pop(MANIFEST_PATH, None)
        if manifest_info is None:
            raise BundleError(f"{self.path} is not a complete bundle",
                              [f"{MANIFEST_PATH} is missing", *problems])
        # A manifest lists the bundle's members, a few hundred bytes each: one far larger than
        # its bundle's members need is refused before it is parsed (a 267 MB manifest of
        # 6.5 M made-up entries took 2.9 GB to parse).
        most = min(MAX_MANIFEST_BYTES,
                   MANIFEST_BASE_BYTES + MANIFEST_BYTES_PER_MEMBER * len(self._infos))
        if manifest_info.size > most:
            raise BundleError(f"{MANIFEST_PATH} is {manifest_info.size} bytes, over the {most} "
                              f"a manifest of a bundle of {len(self._infos)} members may have")
        handle = self._tar.extractfile(manifest_info.tarinfo())
        assert handle is not None  # a regular file, checked above
        manifest = Manifest.from_bytes(handle.read())
        if expect_digest and manifest.content_digest != expect_digest:
            raise BundleError(f"the bundle's content_digest is {manifest.content_digest}, not "
                              f"the {expect_digest} expected; nothing was imported")
        listed = {m.path: m for m in manifest.members}
        if len(listed) != len(manifest.members):
            problems.append(f"{MANIFEST_PATH} lists a member twice")
        for path, member in sorted(listed.items()):
            found = seen.get(path)
            if found is None:
                problems.append(f"{path} is missing (listed in {MANIFEST_PATH})")
                continue
            if found.size != member.size:  # checked before a byte is read
                problems.append(f"{path} was altered: {found.size} bytes, the manifest says "
                                f"{member.size}")
                continue
            try:
                sha, size, rows = self._hash(found, progress, member.size)
            except (tarfile.TarError, OSError) as error:
                problems.append(f"{path} cannot be read ({error})")
                continue
            if size != member.size or sha != member.sha256:
                problems.append(f"{path} was altered: SHA-256 {sha[:16]}… and {size} bytes, "
                                f"the manifest says {member.sha256[:16]}… and {member.size}")
            elif member.rows is not None and rows != member.rows:
                problems.append(f"{path} has {rows} rows, the manifest says {member.rows}")
        for path in sorted(set(seen) - set(listed)):
            problems.append(f"{path} was added (not in {MANIFEST_PATH})")
        if problems:
            raise BundleError(f"{self.path} failed verification; nothing was imported", problems)
        self._index = {path: seen[path] for path in listed}
        self.manifest = manifest
        return manifest

    def _hash(self, info: _Entry, progress: Any,
              most: int) -> tuple[str, int, int]:
        """SHA-256, size and line count of a member, reading at most ``most`` + 1 bytes."""
        handle = self._tar.extractfile(info.tarinfo())
        assert handle is not None
        digest, size, rows = hashlib.sha256(), 0, 0
        while chunk := handle.read(min(CHUNK, most + 1 - size)):
            digest.update(chunk)
            size += len(chunk)
            rows += chunk.count(b"\n")
            if progress is not None:
                progress(len(chunk))
        return digest.hexdigest(), size, rows

    def _open(self, path: str) -> IO[bytes]:
        if self.manifest is None:
            raise BundleError("verify() the bundle before reading from it")
        info = self._index.get(path)
        if info is None:
            raise KeyError(path)
        handle = self._tar.extractfile(info.tarinfo())
        assert handle is not None
        return handle

    def has(self, path: str) -> bool:
        return path in self._index

    def rows(self, kind: str) -> Iterator[dict[str, Any]]:
        """The rows of one part in file order (none when the bundle has no such part)."""
        path = part_path(kind)
        if self.manifest is None:
            raise BundleError("verify() the bundle before reading from it")
        if not self.has(path):
            return
        handle = self._open(path)
        for number, line in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise BundleError(f"{path} line {number} is over {MAX_LINE_BYTES} bytes")
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
                raise BundleError(f"{path} line {number} is not JSON ({error})") from None
            if not isinstance(row, dict):
                raise BundleError(f"{path} line {number} is not a JSON object")
            if "fleet_id" in row and row["fleet_id"] != self.manifest.fleet_id:
                # Governance's import calls act on the token's fleet, not the row's: a row of
                # another fleet would land in this one.
                raise BundleError(f"{path} line {number} is of fleet {row['fleet_id']!r}, not "
                                  f"the bundle's {self.manifest.fleet_id!r}")
            yield row

    def messages(self, kind: str, message: type[Any]) -> Iterator[Any]:
        """The rows of one part, each parsed as ``message`` (:func:`parse_row`)."""
        return (parse_row(row, message(), kind) for row in self.rows(kind))

    def blob(self, sha256: str) -> IO[bytes]:
        return self._open(blob_path(sha256))

    def close(self) -> None:
        self._tar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def parse_row(row: dict[str, Any], message: Any, kind: str) -> Any:
    """A part's row as its message, or a BundleError naming the part."""
    try:
        return ParseDict(row, message)
    except ParseError as error:
        raise BundleError(f"a row of {kind} is not a {message.DESCRIPTOR.name}: {error}; "
                          "stopped before it") from None


def iteration_row(row: dict[str, Any]) -> tuple[str, cpb.ImportedIteration]:
    """A row of the iterations part: its run and the ImportedIteration it carries (the summary,
    and the detail and guardrails when the origin still kept them)."""
    body = {k: v for k, v in row.items() if k not in ("run_id", "detail_json", "guardrails_json")}
    return str(row.get("run_id", "")), cpb.ImportedIteration(
        summary=parse_row(body, cpb.IterationSummary(), "iterations"),
        detail_json=str(row.get("detail_json", "")),
        guardrails_json=str(row.get("guardrails_json", "")))
