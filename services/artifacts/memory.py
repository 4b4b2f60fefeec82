"""ExternalMemory: the seed-004 operations over the repository and the blob store.

No grpc here: the servicer converts at the edge. Bytes stream through in
chunks (never a whole file in memory) and are hashed on every write and read.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from services.artifacts.domain import validation as check
from services.artifacts.domain.chain import (
    ChainVerifier,
    evidence_id,
    manifest_id,
    new_id,
    sha256_text,
)
from services.artifacts.domain.entities import (
    Artifact,
    ArtifactProblem,
    Event,
    Evidence,
    Manifest,
    Pointer,
    PointerType,
    Resolution,
    Run,
    RunStatus,
    Snapshot,
)
from services.artifacts.domain.stop import (
    STOP_EVENT_TYPE,
    Outcome,
    PointerResolver,
    unresolved_payload,
)
from services.artifacts.repository import ArtifactsRepository, EventDraft
from services.common.blobstore import BlobInfo, BlobStore
from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
)

log = logging.getLogger("engram.artifacts")

RESERVED_EVENT_PREFIX = "run."
DEFAULT_REHYDRATE_EVENTS = 10_000
MAX_REHYDRATE_EVENTS = 100_000
CLIENT_STOP_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class ArtifactUpload:
    run_id: str
    step_id: str
    name: str
    mime_type: str = "application/octet-stream"
    metadata_json: str = ""
    expected_size_bytes: int | None = None
    expected_hash: str = ""


@dataclass(frozen=True)
class UploadEnd:
    """The client's end-of-upload marker: what it sent. Without it a stream is a truncation."""

    size_bytes: int
    sha256: str = ""


@dataclass(frozen=True)
class Rehydration:
    run: Run
    snapshot: Snapshot | None
    events: list[Event]
    truncated: bool
    manifest: Manifest | None


class ExternalMemory:
    def __init__(self, repository: ArtifactsRepository, blobs: BlobStore,
                 retry_delay_s: float = 0.05) -> None:
        self.repository = repository
        self.blobs = blobs
        self.retry_delay_s = retry_delay_s

    # -- runs ---------------------------------------------------------------

    def start_run(self, fleet_id: str, agent_id: str, run_id: str = "",
                  metadata_json: str = "") -> tuple[Run, bool]:
        run = Run(run_id=check.identifier("run_id", run_id) if run_id else new_id("run"),
                  fleet_id=fleet_id, agent_id=agent_id, status=RunStatus.RUNNING,
                  stop_reason="", created_us=now_us(), stopped_us=0, event_count=0,
                  head_hash="", latest_snapshot_id="",
                  metadata_json=check.metadata_object(metadata_json))
        return self.repository.create_run(run)

    def stop_run(self, fleet_id: str, agent_id: str, run_id: str, status: RunStatus,
                 reason: str) -> Run:
        if status not in CLIENT_STOP_STATUSES:
            raise InvalidArgument(
                "a run stops as SUCCEEDED, FAILED or CANCELLED (SYSTEM_ERROR is the service's)",
                reason="INVALID_STOP_STATUS")
        reason = check.short_text("reason", reason, 1024)
        payload = check.canonical_json({"status": status.value, "reason": reason})
        return self.repository.stop_run(
            fleet_id, check.identifier("run_id", run_id), status, reason,
            EventDraft(STOP_EVENT_TYPE, payload, agent_id=agent_id), now_us())

    # -- artifacts ----------------------------------------------------------

    def upload(self, fleet_id: str, upload: ArtifactUpload,
               parts: Iterable[bytes | UploadEnd]) -> Artifact:
        """Store the chunks of ``parts``; only a stream closed by an ``UploadEnd`` is complete."""
        path = check.artifact_path(upload.run_id, upload.step_id, upload.name)
        mime_type = check.short_text("mime_type", upload.mime_type or
                                     "application/octet-stream", check.MAX_MIME_LEN)
        metadata_json = check.metadata_object(upload.metadata_json)
        if upload.expected_hash and len(upload.expected_hash) != 64:
            raise InvalidArgument("expected_hash must be a SHA-256 hex digest (64 characters)")
        run = self.repository.get_run(fleet_id, upload.run_id)
        if run.status is not RunStatus.RUNNING:
            raise FailedPrecondition(f"run {run.run_id!r} is stopped ({run.status.value}); "
                                     "it takes no more artifacts", reason="RUN_STOPPED")
        prior = self.repository.artifact_at(path)
        if prior is not None:
            raise AlreadyExists(f"artifact {prior.artifact_id} already holds {path!r}",
                                reason="ARTIFACT_EXISTS",
                                metadata={"artifact_id": prior.artifact_id, "path": path})
        received = _CheckedUpload(upload)
        info = self.blobs.put(path, received.chunks(parts), before_commit=received.check_hash)
        artifact = Artifact(artifact_id=new_id("art"), run_id=upload.run_id,
                            step_id=upload.step_id, path=path, hash=info.sha256,
                            mime_type=mime_type, size_bytes=info.size_bytes,
                            created_us=now_us(), metadata_json=metadata_json)
        try:
            return self.repository.add_artifact(fleet_id, artifact)
        except BaseException:
            self.blobs.delete(path)  # no row, so no blob: never an orphan from a failed insert
            raise

    def get_artifact(self, fleet_id: str, artifact_id: str) -> Artifact:
        return self.repository.get_artifact(fleet_id, check.identifier("artifact_id",
                                                                       artifact_id))

    def read(self, fleet_id: str, artifact_id: str,
             chunk_size: int = 1 << 20) -> tuple[Artifact, Iterator[bytes]]:
        """The artifact and its verified bytes; a mismatch raises IntegrityError at the end."""
        artifact = self.get_artifact(fleet_id, artifact_id)
        try:
            stream = self.blobs.open(artifact.path, chunk_size)
        except NotFound:
            raise _blob_missing(artifact) from None
        return artifact, _verified_read(artifact, stream)

    def verify(self, fleet_id: str, run_id: str = "") -> tuple[int, list[ArtifactProblem]]:
        if run_id:
            self.repository.get_run(fleet_id, run_id)
        checked, problems = 0, []
        for artifact in self.repository.iter_fleet_artifacts(fleet_id, run_id):
            checked += 1
            problem = self._check_blob(artifact)
            if problem is not None:
                log.warning("artifact integrity problem", extra=problem.__dict__)
                problems.append(problem)
        return checked, problems

    def _check_blob(self, artifact: Artifact) -> ArtifactProblem | None:
        try:
            stream = self.blobs.open(artifact.path)
        except NotFound:
            return ArtifactProblem(artifact.artifact_id, artifact.path, "BLOB_MISSING",
                                   artifact.hash, "", artifact.size_bytes, 0)
        digest, size = hashlib.sha256(), 0
        for chunk in stream:
            digest.update(chunk)
            size += len(chunk)
        actual = digest.hexdigest()
        if actual == artifact.hash and size == artifact.size_bytes:
            return None
        kind = "BLOB_SIZE_MISMATCH" if size != artifact.size_bytes else "BLOB_HASH_MISMATCH"
        return ArtifactProblem(artifact.artifact_id, artifact.path, kind, artifact.hash, actual,
                               artifact.size_bytes, size)

    # -- events and snapshots -----------------------------------------------

    def append_event(self, fleet_id: str, agent_id: str, run_id: str, type: str,
                     payload_json: str, manifest_id: str = "", artifact_ids: tuple[str, ...] = (),
                     request_id: str = "") -> tuple[Event, bool]:
        type = check.short_text("type", type.strip(), check.MAX_TYPE_LEN)
        if not type:
            raise InvalidArgument("an event needs a type (e.g. 'tool.called')")
        if type.startswith(RESERVED_EVENT_PREFIX):
            raise InvalidArgument(f"event types starting with {RESERVED_EVENT_PREFIX!r} are "
                                  "written by the service", reason="RESERVED_EVENT_TYPE")
        draft = EventDraft(
            type=type, payload_json=check.json_document("payload_json", payload_json),
            manifest_id=check.identifier("manifest_id", manifest_id) if manifest_id else "",
            artifact_ids=check.references("artifact_id", artifact_ids), agent_id=agent_id,
            request_id=check.identifier("request_id", request_id) if request_id else "")
        return self.repository.append_event(fleet_id, check.identifier("run_id", run_id),
                                            draft, now_us())

    def list_events(self, fleet_id: str, run_id: str, after_seq: int, limit: int) -> list[Event]:
        if after_seq < 0:
            raise InvalidArgument("after_seq must be >= 0")
        return self.repository.events_after(fleet_id, check.identifier("run_id", run_id),
                                            after_seq, limit)

    def replay(self, fleet_id: str, run_id: str) -> Iterator[Event]:
        """Every event from seq 1, each checked against the hash chain as it passes."""
        run = self.repository.get_run(fleet_id, check.identifier("run_id", run_id))
        verifier = ChainVerifier(run.run_id)
        for event in self.repository.iter_events(fleet_id, run.run_id):
            yield verifier.check(event)
        if verifier.length != run.event_count or verifier.head != run.head_hash:
            raise IntegrityError(
                f"run {run.run_id}: the log ends at {verifier.length} but the run records "
                f"{run.event_count} events (truncated log)", reason="EVENT_CHAIN_BROKEN",
                metadata={"run_id": run.run_id})

    def create_snapshot(self, fleet_id: str, run_id: str, state_json: str, seq: int = 0,
                        manifest_id: str = "", artifact_ids: tuple[str, ...] = ()) -> Snapshot:
        if seq < 0:
            raise InvalidArgument("seq must be >= 0 (0 means the run's current head)")
        state = check.json_document("state_json", state_json)
        snapshot = Snapshot(
            snapshot_id=new_id("snap"), run_id=check.identifier("run_id", run_id), seq=seq,
            state_json=state, state_hash=sha256_text(state),
            manifest_id=check.identifier("manifest_id", manifest_id) if manifest_id else "",
            artifact_ids=check.references("artifact_id", artifact_ids), created_us=now_us())
        return self.repository.add_snapshot(fleet_id, snapshot)

    def latest_snapshot(self, fleet_id: str, run_id: str) -> Snapshot:
        _run, snapshot = self.repository.latest_snapshot(fleet_id,
                                                         check.identifier("run_id", run_id))
        if snapshot is None:
            raise NotFound(f"run {run_id!r} has no snapshot yet", reason="NO_SNAPSHOT")
        return snapshot

    def rehydrate(self, fleet_id: str, agent_id: str, run_id: str,
                  max_events: int = 0) -> Rehydration:
        if max_events < 0:
            raise InvalidArgument("max_events must be >= 0")
        limit = min(max_events or DEFAULT_REHYDRATE_EVENTS, MAX_REHYDRATE_EVENTS)
        run, snapshot, events = self.repository.rehydrate(
            fleet_id, check.identifier("run_id", run_id), limit + 1)
        manifest = None
        if snapshot is not None:
            if snapshot.manifest_id:
                self.resolve(fleet_id, agent_id, run.run_id,
                             Pointer(PointerType.MANIFEST, snapshot.manifest_id), critical=True)
                manifest = self.repository.get_manifest(fleet_id, snapshot.manifest_id)
            for artifact_id in snapshot.artifact_ids:
                self.resolve(fleet_id, agent_id, run.run_id,
                             Pointer(PointerType.ARTIFACT, artifact_id), critical=True)
        return Rehydration(run=run, snapshot=snapshot, events=events[:limit],
                           truncated=len(events) > limit, manifest=manifest)

    # -- evidence and manifests ---------------------------------------------

    def create_evidence(self, fleet_id: str, corpus_id: str, index_id: str, chunk_id: str,
                        span_start: int, span_end: int, artifact_id: str = "",
                        metadata_json: str = "") -> tuple[Evidence, bool]:
        for kind, value in (("corpus_id", corpus_id), ("index_id", index_id),
                            ("chunk_id", chunk_id)):
            check.identifier(kind, value)
        if span_start < 0 or span_end < span_start:
            raise InvalidArgument(f"span [{span_start}, {span_end}) must satisfy "
                                  "0 <= start <= end", reason="INVALID_SPAN")
        evidence = Evidence(
            fleet_id=fleet_id,
            evidence_id=evidence_id(corpus_id, index_id, chunk_id, span_start, span_end),
            corpus_id=corpus_id, index_id=index_id, chunk_id=chunk_id, span_start=span_start,
            span_end=span_end,
            artifact_id=check.identifier("artifact_id", artifact_id) if artifact_id else "",
            metadata_json=check.metadata_object(metadata_json), created_us=now_us())
        return self.repository.add_evidence(evidence)

    def get_evidence(self, fleet_id: str, evidence_id_: str) -> Evidence:
        found = self.repository.get_evidence(fleet_id, check.identifier("evidence_id",
                                                                         evidence_id_))
        if found is None:
            raise NotFound(f"evidence {evidence_id_!r} not found", reason="EVIDENCE_NOT_FOUND")
        return found

    def create_manifest(self, fleet_id: str, content_json: str,
                        run_id: str = "") -> tuple[Manifest, bool]:
        content = check.json_document("content_json", content_json, default="")
        manifest = Manifest(fleet_id=fleet_id, manifest_id=manifest_id(content),
                            run_id=check.identifier("run_id", run_id) if run_id else "",
                            content_json=content, content_hash=sha256_text(content),
                            created_us=now_us())
        return self.repository.add_manifest(manifest)

    def get_manifest(self, fleet_id: str, manifest_id_: str) -> Manifest:
        found = self.repository.get_manifest(fleet_id, check.identifier("manifest_id",
                                                                         manifest_id_))
        if found is None:
            raise NotFound(f"manifest {manifest_id_!r} not found", reason="MANIFEST_NOT_FOUND")
        if sha256_text(found.content_json) != found.content_hash:
            raise IntegrityError(f"manifest {found.manifest_id} no longer matches its hash",
                                 reason="MANIFEST_HASH_MISMATCH")
        return found

    # -- pointers and stop semantics ----------------------------------------

    def lookup(self, fleet_id: str, pointer: Pointer) -> Resolution:
        if pointer.type is PointerType.ARTIFACT:
            try:
                artifact = self.repository.get_artifact(fleet_id, pointer.id)
            except NotFound:
                return Resolution(False)
            return Resolution(self.blobs.exists(artifact.path), artifact.path, artifact.hash)
        if pointer.type is PointerType.EVIDENCE:
            evidence = self.repository.get_evidence(fleet_id, pointer.id)
            if evidence is None:
                return Resolution(False)
            if not evidence.artifact_id:
                return Resolution(True)
            return self.lookup(fleet_id, Pointer(PointerType.ARTIFACT, evidence.artifact_id))
        manifest = self.repository.get_manifest(fleet_id, pointer.id)
        if manifest is None:
            return Resolution(False)
        intact = sha256_text(manifest.content_json) == manifest.content_hash
        return Resolution(intact, "", manifest.content_hash)

    def resolve(self, fleet_id: str, agent_id: str, run_id: str, pointer: Pointer,
                critical: bool) -> Outcome:
        check.identifier(f"{pointer.type.value} id", pointer.id)
        run = self.repository.get_run(fleet_id, check.identifier("run_id", run_id))
        resolver = PointerResolver(lambda p: self.lookup(fleet_id, p), self.retry_delay_s)
        outcome = resolver.resolve(pointer, critical)
        if outcome.resolution.resolved or not critical:
            return outcome
        diagnostics = {"run_id": run.run_id, "pointer_type": pointer.type.value,
                       "pointer_id": pointer.id, "path": outcome.resolution.path,
                       "hash": outcome.resolution.hash, "attempts": str(outcome.attempts)}
        log.error("critical pointer unresolved; stopping run", extra=diagnostics)
        status = run.status
        if run.status is RunStatus.RUNNING:
            try:
                stopped = self.repository.stop_run(
                    fleet_id, run.run_id, RunStatus.SYSTEM_ERROR,
                    f"critical {pointer.type.value} {pointer.id} unresolved",
                    EventDraft(STOP_EVENT_TYPE,
                               unresolved_payload(pointer, outcome.resolution, outcome.attempts)),
                    now_us())
                status = stopped.status
            except FailedPrecondition:
                status = self.repository.get_run(fleet_id, run.run_id).status
        raise NotFound(
            f"critical {pointer.type.value} {pointer.id} could not be resolved after "
            f"{outcome.attempts} attempts; run {run.run_id} is {status.value}",
            reason="CRITICAL_POINTER_UNRESOLVED",
            metadata={**diagnostics, "run_status": status.value})


class _CheckedUpload:
    """Passes chunks through and refuses, before anything is committed, a stream that is
    cut short, longer than declared, or whose bytes differ from the declared hash."""

    def __init__(self, upload: ArtifactUpload) -> None:
        self.upload = upload
        self.end: UploadEnd | None = None

    def chunks(self, parts: Iterable[bytes | UploadEnd]) -> Iterator[bytes]:
        declared, size = self.upload.expected_size_bytes, 0
        for part in parts:
            if self.end is not None:
                raise InvalidArgument("the upload trailer must be the last message",
                                      reason="UPLOAD_MALFORMED")
            if isinstance(part, UploadEnd):
                self.end = part
                continue
            size += len(part)
            if declared is not None and size > declared:
                raise InvalidArgument(f"upload exceeds its declared {declared} bytes",
                                      reason="UPLOAD_SIZE_MISMATCH")
            yield part
        if self.end is None:
            raise InvalidArgument(
                f"upload ended after {size} bytes without its trailer (cancelled or cut off); "
                "nothing was stored", reason="UPLOAD_TRUNCATED")
        for expected in (declared, self.end.size_bytes):
            if expected is not None and size != expected:
                raise InvalidArgument(
                    f"upload ended after {size} of {expected} declared bytes (truncated); "
                    "nothing was stored", reason="UPLOAD_TRUNCATED")

    def check_hash(self, info: BlobInfo) -> None:
        trailer_hash = self.end.sha256 if self.end is not None else ""
        for expected in (self.upload.expected_hash, trailer_hash):
            if expected and info.sha256 != expected.lower():
                raise InvalidArgument("uploaded bytes do not match the declared SHA-256; "
                                      "nothing was stored", reason="UPLOAD_HASH_MISMATCH")


def _blob_missing(artifact: Artifact) -> IntegrityError:
    return IntegrityError(
        f"artifact {artifact.artifact_id}: its blob {artifact.path} is missing from the store",
        reason="BLOB_MISSING",
        metadata={"artifact_id": artifact.artifact_id, "path": artifact.path,
                  "hash": artifact.hash})


def _verified_read(artifact: Artifact, stream: Iterator[bytes]) -> Iterator[bytes]:
    digest, size = hashlib.sha256(), 0
    for chunk in stream:
        size += len(chunk)
        if size > artifact.size_bytes:
            break
        digest.update(chunk)
        yield chunk
    if size != artifact.size_bytes or digest.hexdigest() != artifact.hash:
        raise IntegrityError(
            f"artifact {artifact.artifact_id}: bytes at {artifact.path} no longer match the "
            f"stored hash (altered or truncated); discard what was received",
            reason="BLOB_HASH_MISMATCH",
            metadata={"artifact_id": artifact.artifact_id, "path": artifact.path,
                      "hash": artifact.hash})
