"""Cold snapshots in the blob store: one gzip file per due iteration, read back digest-checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.blobstore import BlobStore
from services.common.errors import IntegrityError
from services.compactor.domain.blob_layout import (
    SnapshotContent,
    digest_of,
    gzip_chunks,
    read_snapshot,
    snapshot_payload,
)
from services.compactor.domain.model import HotEntry, SnapshotInfo
from services.compactor.tiers.steps import StepHook, hooked, load, put_once


class ColdArchive:
    def __init__(self, blobs: BlobStore, hook: StepHook) -> None:
        self._blobs = blobs
        self._hook = hook

    def write(self, fleet_id: str, run_id: str, snapshot: SnapshotInfo,
              hot: HotEntry) -> tuple[str, int]:
        """Store ``snapshot`` of the hot entry; its sha256 and size in bytes."""
        payload = snapshot_payload(fleet_id, run_id, hot.line, hot.detail_json,
                                   hot.guardrails_json)
        compressed = b"".join(gzip_chunks(payload))
        sha = digest_of(compressed)
        put_once(self._blobs, snapshot.key,
                 hooked(gzip_chunks(payload), self._hook, "snapshot:mid_gzip",
                        "snapshot:before_rename"), sha)
        self._hook("snapshot:after_rename")
        return sha, len(compressed)

    def delete(self, snapshots: Sequence[SnapshotInfo]) -> None:
        """Retire ``snapshots``: purged with every version (a versioned bucket would otherwise
        keep each retired snapshot's detail as a noncurrent version, out of reach of an
        erasure: found by review on 2026-11-29)."""
        for snapshot in snapshots:
            self._blobs.purge(snapshot.key)
            self._hook("retention:mid")

    def read(self, snapshot: SnapshotInfo) -> SnapshotContent:
        return _content(snapshot, b"".join(self._blobs.open(snapshot.key)))

    def load(self, snapshots: Sequence[SnapshotInfo]) -> dict[int, SnapshotFacts]:
        """What :meth:`check` needs of the ``snapshots``' files as stored now, by iteration:
        each file read, checked and let go before the next (a run may hold a thousand pinned
        snapshots of megabytes each; all of them were held at once: found by review on
        2026-11-30)."""
        return {s.iteration: self._facts(s) for s in snapshots}

    def _facts(self, snapshot: SnapshotInfo) -> SnapshotFacts:
        data = load(self._blobs, snapshot.key).data
        if data is None:
            return SnapshotFacts(missing=True)
        try:
            content = _content(snapshot, data)
        except IntegrityError as exc:
            return SnapshotFacts(problem=str(exc))
        return SnapshotFacts(summary_hash=content.summary.hash,
                             detail_matches=content.summary.commits_detail(
                                 content.detail_json, content.guardrails_json))

    @staticmethod
    def check(snapshots: Sequence[SnapshotInfo], files: Mapping[int, SnapshotFacts],
              hashes: Mapping[int, str]) -> list[tuple[str, str]]:
        """Problems of stored ``snapshots`` (their ``files`` as loaded) against the warm log's
        line ``hashes``."""
        problems: list[tuple[str, str]] = []
        for snapshot in snapshots:
            where = f"snapshot {snapshot.iteration}"
            facts = files[snapshot.iteration]
            if facts.missing:
                problems.append((where, f"cold snapshot {snapshot.key} is missing"))
            elif facts.problem:
                problems.append((where, facts.problem))
            elif hashes.get(snapshot.iteration) != facts.summary_hash:
                problems.append((where, "its summary is not the warm log's line"))
            elif not facts.detail_matches:
                problems.append((where, "its detail does not match the line's detailDigest"))
        return problems


@dataclass(frozen=True)
class SnapshotFacts:
    """What a verify needs of one stored snapshot file: missing, or why it does not read, or
    its summary's hash and whether its detail is the one the summary commits to."""

    missing: bool = False
    problem: str = ""
    summary_hash: str = ""
    detail_matches: bool = False


def _content(snapshot: SnapshotInfo, data: bytes) -> SnapshotContent:
    """The snapshot's content, checked against its recorded digest."""
    if digest_of(data) != snapshot.sha256:
        raise IntegrityError(f"cold snapshot {snapshot.key} does not match its digest",
                             reason="SNAPSHOT_TAMPERED")
    try:
        return read_snapshot(data)
    except ValueError as exc:
        raise IntegrityError(f"cold snapshot {snapshot.key}: {exc}",
                             reason="SNAPSHOT_TAMPERED") from None
