"""What the artifacts service stores: plain frozen dataclasses.

Times are microseconds since the Unix epoch (UTC). JSON fields hold canonical
JSON text (sorted keys, no spaces) so hashes over them are reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RunStatus(Enum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    SYSTEM_ERROR = "SYSTEM_ERROR"

    @property
    def is_final(self) -> bool:
        return self is not RunStatus.RUNNING


class PointerType(Enum):
    ARTIFACT = "artifact"
    EVIDENCE = "evidence"
    MANIFEST = "manifest"


@dataclass(frozen=True)
class Run:
    run_id: str
    fleet_id: str
    agent_id: str
    status: RunStatus
    stop_reason: str
    created_us: int
    stopped_us: int
    event_count: int
    head_hash: str
    latest_snapshot_id: str
    metadata_json: str


@dataclass(frozen=True)
class Artifact:
    artifact_id: str
    run_id: str
    step_id: str
    path: str
    hash: str
    mime_type: str
    size_bytes: int
    created_us: int
    metadata_json: str


@dataclass(frozen=True)
class Event:
    run_id: str
    seq: int
    type: str
    payload_json: str
    manifest_id: str
    artifact_ids: tuple[str, ...]
    created_us: int
    agent_id: str
    prev_hash: str
    hash: str
    format: int = 1
    """1: ``hash`` covers the payload itself; 2: its salted commitment (docs/erasure.md)."""
    salt: str = ""
    """Format 2: 32 random bytes (hex), kept beside the payload and erased with it."""
    payload_commitment: str = ""
    """Format 2: SHA-256("engram-commit-v2" 0x1f salt payload_json)."""
    erasure_id: str = ""
    """Set when erased in place (a tombstone): payload and salt are gone, the rest is kept."""
    erased_us: int = 0
    erased_by: str = ""

    @property
    def erased(self) -> bool:
        return bool(self.erasure_id)


@dataclass(frozen=True)
class EventDraft:
    """An event before it joins its run's chain (seq, time and hashes come then)."""

    type: str
    payload_json: str
    manifest_id: str = ""
    artifact_ids: tuple[str, ...] = ()
    agent_id: str = ""
    request_id: str = ""


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: str
    run_id: str
    seq: int
    state_json: str
    state_hash: str
    """Format 1: SHA-256 of state_json; format 2: its commitment under ``salt``."""
    manifest_id: str
    artifact_ids: tuple[str, ...]
    created_us: int
    format: int = 1
    salt: str = ""
    erasure_id: str = ""
    """Set when erased in place (a tombstone): state and salt are gone, state_hash kept."""
    erased_us: int = 0
    erased_by: str = ""

    @property
    def erased(self) -> bool:
        return bool(self.erasure_id)


@dataclass(frozen=True)
class ManifestProblem:
    """A stored manifest that no longer matches its hash (or its id, docs/artifacts.md)."""

    manifest_id: str
    run_id: str
    problem: str  # MANIFEST_HASH_MISMATCH
    expected_hash: str
    actual_hash: str


@dataclass(frozen=True)
class SnapshotProblem:
    """A stored snapshot whose state no longer matches its hash, or whose fields do not parse."""

    snapshot_id: str
    run_id: str
    problem: str  # SNAPSHOT_HASH_MISMATCH or SNAPSHOT_UNREADABLE
    expected_hash: str
    actual_hash: str


@dataclass(frozen=True)
class StoredTombstone:
    """An event or snapshot as erased in place, or a run erased whole, what VerifyArtifacts
    checks against the erasure it names: kind ``event`` (id ``<run_id>:<seq>``, leaf its hash),
    ``snapshot`` (id its snapshot_id, leaf its state_hash) or ``run`` (id its run_id, leaf its
    head hash as the erasure listed it)."""

    kind: str
    id: str
    run_id: str
    leaf_hash: str
    erasure_id: str
    well_formed: bool
    """Whether it has a tombstone's form (``chain.tombstone_intact``)."""


@dataclass(frozen=True)
class TombstoneProblem:
    """A tombstone no recorded erasure accounts for (TOMBSTONE_NOT_IN_ERASURE), or a malformed
    one (INVALID_TOMBSTONE)."""

    kind: str
    id: str
    run_id: str
    erasure_id: str
    problem: str
    leaf_hash: str


@dataclass(frozen=True)
class Evidence:
    fleet_id: str
    evidence_id: str
    corpus_id: str
    index_id: str
    chunk_id: str
    span_start: int
    span_end: int
    artifact_id: str
    metadata_json: str
    created_us: int


@dataclass(frozen=True)
class Manifest:
    fleet_id: str
    manifest_id: str
    run_id: str
    content_json: str
    content_hash: str
    created_us: int
    format: int = 1
    """1: id and content_hash derived from the content itself; 2: a random id, content_hash
    the content's commitment under ``salt`` (docs/erasure.md)."""
    salt: str = ""


@dataclass(frozen=True)
class Pointer:
    type: PointerType
    id: str


@dataclass(frozen=True)
class Resolution:
    """Where a pointer led: path and hash when known, empty otherwise."""

    resolved: bool
    path: str = ""
    hash: str = ""


@dataclass(frozen=True)
class ArtifactProblem:
    artifact_id: str
    path: str
    problem: str
    expected_hash: str
    actual_hash: str
    expected_size_bytes: int
    actual_size_bytes: int
