"""The sealed part of the warm chain in the blob store: segment files and the index file."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from services.common.blobstore import BlobStore
from services.common.errors import IntegrityError, NotFound
from services.compactor.domain.blob_layout import (
    SegmentEntry,
    digest_of,
    index_document,
    index_key,
    parse_index,
    parse_segment,
    rewritten_segment_key,
    run_prefix,
    segment_bytes,
    segment_key,
)
from services.compactor.domain.warm_chain import ChainWalker, WarmLine
from services.compactor.tiers.steps import StepHook, StoredBlob, hooked, load, put_once


class WarmArchive:
    def __init__(self, blobs: BlobStore, hook: StepHook) -> None:
        self._blobs = blobs
        self._hook = hook

    def write_segment(self, fleet_id: str, run_id: str, seq: int,
                      lines: Sequence[WarmLine]) -> SegmentEntry:
        """Store segment ``seq`` of ``lines``; the entry the index file lists for it."""
        data = segment_bytes(lines)
        entry = SegmentEntry(
            seq=seq, key=segment_key(fleet_id, run_id, seq, lines[0].start_ts),
            first_iter=lines[0].iteration, last_iter=lines[-1].iteration, lines=len(lines),
            bytes=len(data), sha256=digest_of(data), first_prev_hash=lines[0].prev_hash,
            last_hash=lines[-1].hash)
        put_once(self._blobs, entry.key,
                 hooked([data], self._hook, None, "seal:before_rename"), entry.sha256)
        self._hook("seal:after_rename")
        return entry

    def rewrite_segment(self, fleet_id: str, run_id: str, entry: SegmentEntry,
                        lines: Sequence[WarmLine]) -> SegmentEntry:
        """Store sealed segment ``entry`` again holding ``lines`` (the same iterations and
        hashes, some lines tombstoned) under a key named by its new content; its new entry.
        The old file is the caller's to purge once the new entry is committed."""
        data = segment_bytes(lines)
        sha = digest_of(data)
        new = replace(entry, key=rewritten_segment_key(fleet_id, run_id, entry.seq, sha),
                      bytes=len(data), sha256=sha)
        put_once(self._blobs, new.key, data, sha)
        return new

    def write_index(self, fleet_id: str, run_id: str, version: int,
                    segments: Sequence[SegmentEntry]) -> None:
        document = index_document(fleet_id, run_id, version, segments)
        put_once(self._blobs, index_key(fleet_id, run_id, version), document,
                 digest_of(document))
        self._hook("seal:after_index")

    def discard_index(self, fleet_id: str, run_id: str, version: int) -> None:
        """Purge index file ``version`` (one no committed head names yet)."""
        self._blobs.purge(index_key(fleet_id, run_id, version))

    def drop_indexes_before(self, fleet_id: str, run_id: str, version: int) -> None:
        current = index_key(fleet_id, run_id, version)
        for key in list(self._blobs.list(f"{run_prefix(fleet_id, run_id)}/warm/index/")):
            if key < current:
                self._blobs.purge(key)  # every version: no noncurrent copy lists old segments

    def read_segment(self, entry: SegmentEntry) -> list[WarmLine]:
        data = b"".join(self._blobs.open(entry.key))
        if digest_of(data) != entry.sha256:
            raise IntegrityError(f"warm segment {entry.key} does not match its recorded digest; "
                                 "run `engram compactor verify`", reason="SEGMENT_TAMPERED")
        return [WarmLine.parse(text) for text in parse_segment(data)]

    def read_index(self, fleet_id: str, run_id: str, version: int) -> list[SegmentEntry]:
        return parse_index(b"".join(self._blobs.open(index_key(fleet_id, run_id, version))))

    def load_index(self, fleet_id: str, run_id: str, version: int,
                   sealed: Sequence[SegmentEntry]) -> StoredBlob | None:
        """Index file ``version`` as stored now, for :meth:`check_index`; None when no segment
        is sealed (there is no index to check)."""
        if not sealed:
            return None
        return load(self._blobs, index_key(fleet_id, run_id, version))

    @staticmethod
    def check_index(index: StoredBlob | None,
                    sealed: Sequence[SegmentEntry]) -> list[tuple[str, str]]:
        """Problems of the ``index`` file: missing, unreadable, or not listing ``sealed``."""
        if index is None:
            return []
        if index.data is None:
            return [("index", f"index file {index.key} is missing")]
        try:
            listed = parse_index(index.data)
        except (ValueError, KeyError, TypeError) as exc:
            return [("index", f"index file {index.key} is unreadable: {exc}")]
        if listed != sealed:
            return [("index", f"index file {index.key} does not list the sealed segments")]
        return []

    def check_segments(self, sealed: Sequence[SegmentEntry], walker: ChainWalker,
                       ) -> tuple[list[tuple[str, str]], dict[int, str]]:
        """Feed every sealed line to ``walker``; the files' problems and each line's hash."""
        problems: list[tuple[str, str]] = []
        hashes: dict[int, str] = {}
        for entry in sealed:
            where = f"segment {entry.seq}"
            try:
                data = b"".join(self._blobs.open(entry.key))
            except NotFound:
                problems.append((where, f"segment file {entry.key} is missing"))
                continue
            if digest_of(data) != entry.sha256:
                problems.append((where, f"{entry.key} does not match the digest in the index"))
            texts = parse_segment(data)
            if len(texts) != entry.lines:
                problems.append((where, f"has {len(texts)} lines, the index says {entry.lines}"))
            for number, text in enumerate(texts, start=1):
                line = walker.feed_text(f"{where} line {number}", text)
                if line is not None:
                    hashes[line.iteration] = line.hash
        return problems, hashes
