"""ArtifactsService: the seed-004 use cases over the repository and the blob store.

It owns the transactions: appends to a run (events, snapshots, the stop) lock the
run's row (``FOR UPDATE`` on Postgres; one writer lock on SQLite, whose deferred
transactions cannot upgrade safely) so sequence numbers have no gaps and the hash
chain no forks. No grpc here: the servicer converts at the edge. Bytes stream through
in chunks (never a whole file in memory) and are hashed on every write and read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session

from engram.client.artifacts import MIME_TYPE
from services.artifacts.domain import validation as check
from services.artifacts.domain.chain import (
    ChainVerifier,
    evidence_id,
    manifest_id,
    manifest_intact,
    manifest_key,
    manifest_problem,
    new_id,
    new_manifest_id,
    new_snapshot_state,
    next_event,
)
from services.artifacts.domain.entities import (
    Artifact,
    ArtifactProblem,
    Event,
    EventDraft,
    Evidence,
    Manifest,
    ManifestProblem,
    Pointer,
    PointerType,
    Resolution,
    Run,
    RunStatus,
    Snapshot,
    SnapshotProblem,
    StoredTombstone,
)
from services.artifacts.domain.integrity import (
    ArtifactUpload,
    CheckedUpload,
    UploadEnd,
    blob_missing_error,
    blob_missing_problem,
    blob_problem,
    verified_read,
)
from services.artifacts.domain.stop import (
    STOP_EVENT_TYPE,
    Outcome,
    PointerResolver,
    unresolved_payload,
)
from services.artifacts.repository import ArtifactsRepository
from services.artifacts.tombstone_audit import TombstoneAudit, audit_tombstones
from services.common.blobstore import BlobStore
from services.common.blobstore.port import write_hashed
from services.common.canonical import canonical_json
from services.common.commitment import commitment, new_salt
from services.common.db import Database
from services.common.erasure_source import ErasureSource, TextScans, while_wanted
from services.common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
)
from services.common.metrics import Tally
from services.common.pagination import PageTokens
from services.common.tombstone_audit import RecordedErasures

log = logging.getLogger("engram.artifacts")

P = ParamSpec("P")
R = TypeVar("R")
K = TypeVar("K")

RESERVED_EVENT_PREFIX = "run."
DEFAULT_REHYDRATE_EVENTS = 10_000
MAX_REHYDRATE_EVENTS = 100_000
REHYDRATE_BYTES = 16 * 1024 * 1024
"""What one Rehydrate returns of events at most (their payloads and fields): the rest is
``truncated``, for ListEvents to page through. gRPC's reply limit is 64 MiB."""
REHYDRATE_PAGE = 500
CLIENT_STOP_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
EVENT_BATCH = 1000
REPLAY_BATCH = 100
"""Events a replay reads at a time (each up to ~72 KB with its payload and references): a
reader that stalls holds one batch. 1,000 held 72 MB each (found by review on 2026-11-30)."""
PAGE_BYTES = 16 * 1024 * 1024
"""What one page of events or snapshots holds at most (its first item always goes): a page of
1,000 large ones passed gRPC's 64 MiB reply limit (found by review on 2026-11-30)."""
ARTIFACT_BATCH = 500


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class Rehydration:
    run: Run
    snapshot: Snapshot | None
    events: list[Event]
    truncated: bool
    manifest: Manifest | None


class ArtifactsService:
    def __init__(self, database: Database, blobs: BlobStore, retry_delay_s: float = 0.05,
                 limits: check.ArtifactLimits | None = None,
                 pages: PageTokens | None = None) -> None:
        self.db = database
        self._recorded_erasures = RecordedErasures()  # what governance answered, across calls
        self.pages = pages or PageTokens.ephemeral()
        self.repository = ArtifactsRepository(database.dialect)
        self.blobs = blobs
        self.retry_delay_s = retry_delay_s
        self.limits = limits or check.ArtifactLimits()
        self.blob_bytes = Tally()
        """Blob bytes stored (in) and served (out)."""
        self.integrity_failures = Tally()
        """Blobs, snapshots and tombstones found altered, missing or erased by no erasure by a
        verify, by problem."""
        self.whole_fleet_checks = TextScans()
        """Verifies of a whole fleet (every blob re-hashed): at most two at once on a replica
        (SCAN_BUSY beyond), as the shard's; any verify stops when its caller goes."""
        self._writer: AbstractContextManager[object] = (
            threading.Lock() if database.dialect == "sqlite" else contextlib.nullcontext())

    # -- transactions -------------------------------------------------------

    def _in_session(self, query: Callable[Concatenate[Session, P], R], *args: P.args,
              **kwargs: P.kwargs) -> R:
        """``query`` in a session of its own."""
        with self.db.session() as session:
            return query(session, *args, **kwargs)

    def _in_run(self, fleet_id: str, run_id: str, query: Callable[Concatenate[Session, P], R],
                *args: P.args, **kwargs: P.kwargs) -> R:
        """``query`` in a session of its own, once the run is known to be this fleet's."""
        check.identifier("run_id", run_id)
        with self.db.session() as session:
            self.repository.get_run(session, fleet_id, run_id)
            return query(session, *args, **kwargs)

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """The session of a checked write (appends, uploads, erasures, first-writer-wins): one
        at a time on SQLite; on Postgres each locks its run's row."""
        with self._writer, self.db.session() as session:
            yield session

    def _first_answer(self, write: Callable[[Session], tuple[R, bool]],
                      find: Callable[[Session], R | None]) -> tuple[R, bool]:
        """``write``'s answer, or, when a concurrent call with the same key committed first
        (its insert hit a unique key), that call's answer as ``find`` reads it back."""
        try:
            with self.writing() as session:
                return write(session)
        except DbIntegrityError:
            prior = self._in_session(find)
            if prior is None:
                raise Aborted("a concurrent write of the same key conflicted with this one; "
                              "nothing was stored, retry", reason="CONCURRENT_WRITE") from None
            return prior, False

    def _in_batches(self, fetch: Callable[[Session, K, int], list[R]], start: K,
                    key_of: Callable[[R], K], batch: int) -> Iterator[R]:
        """Every row ``fetch`` pages through, one session a batch (none held while yielding)."""
        after = start
        while True:
            rows = self._in_session(fetch, after, batch)
            yield from rows
            if len(rows) < batch:
                return
            after = key_of(rows[-1])

    # -- runs ---------------------------------------------------------------

    def start_run(self, fleet_id: str, agent_id: str, run_id: str = "",
                  metadata_json: str = "") -> tuple[Run, bool]:
        run = Run(run_id=check.identifier("run_id", run_id) if run_id else new_id("run"),
                  fleet_id=fleet_id, agent_id=agent_id, status=RunStatus.RUNNING,
                  stop_reason="", created_us=now_us(), stopped_us=0, event_count=0,
                  head_hash="", latest_snapshot_id="",
                  metadata_json=self.limits.metadata(metadata_json))
        try:
            with self.writing() as session:
                self.repository.add_run(session, run)
                session.flush()
                # After the insert: on Postgres it waited for an erasure deleting this run to
                # commit, so the tombstone is seen; on SQLite erasures take the writer's turn.
                erased = self.repository.run_tombstone(session, fleet_id, run.run_id)
                if erased is not None:
                    raise FailedPrecondition(
                        f"run {run.run_id!r} was erased (erasure {erased}); an erased run's id "
                        "is not used again: start another", reason="RUN_ERASED")
            return run, True
        except DbIntegrityError:
            existing = self.get_run(run.fleet_id, run.run_id)
            if existing.status is not RunStatus.RUNNING:
                raise AlreadyExists(
                    f"run {run.run_id!r} already exists and is {existing.status.value}; "
                    "start a new run with another id", reason="RUN_EXISTS") from None
            return existing, False

    def get_run(self, fleet_id: str, run_id: str) -> Run:
        return self._in_session(self.repository.get_run, fleet_id,
                                check.identifier("run_id", run_id))

    def list_runs(self, fleet_id: str, page_token: str, page_size: int) -> tuple[list[Run], str]:
        return self.pages.paginate(page_token, page_size, {"fleet": fleet_id},
                        lambda after, limit: self._in_session(
                            self.repository.list_runs, fleet_id, after, limit),
                        lambda run: [run.created_us, run.run_id])

    def _running_run(self, session: Session, fleet_id: str, run_id: str, *,
                     lock: bool = False) -> Run:
        run = self.repository.get_run(session, fleet_id, run_id, lock=lock)
        if run.status is not RunStatus.RUNNING:
            raise FailedPrecondition(
                f"run {run_id!r} is stopped ({run.status.value}); it takes no more writes",
                reason="RUN_STOPPED", metadata={"run_id": run_id, "status": run.status.value})
        return run

    def _append(self, session: Session, run: Run, draft: EventDraft, created_us: int) -> Event:
        event = next_event(run, draft, created_us)
        self.repository.add_event(session, run.fleet_id, event, draft.request_id)
        return event

    def stop_run(self, fleet_id: str, agent_id: str, run_id: str, status: RunStatus,
                 reason: str) -> Run:
        if status not in CLIENT_STOP_STATUSES:
            raise InvalidArgument(
                "a run stops as SUCCEEDED, FAILED or CANCELLED (SYSTEM_ERROR is the service's)",
                reason="INVALID_STOP_STATUS")
        reason = check.short_text("reason", reason, 1024)
        payload = canonical_json({"status": status.value, "reason": reason})
        return self._stop(fleet_id, check.identifier("run_id", run_id), status, reason,
                          EventDraft(STOP_EVENT_TYPE, payload, agent_id=agent_id), now_us())

    def _stop(self, fleet_id: str, run_id: str, status: RunStatus, reason: str,
              event: EventDraft, stopped_us: int) -> Run:
        """Append the stop event and mark the run stopped, in one transaction."""
        with self.writing() as session:
            run = self._running_run(session, fleet_id, run_id, lock=True)
            self._append(session, run, event, stopped_us)
            return self.repository.mark_stopped(session, fleet_id, run_id, status, reason,
                                                stopped_us)

    # -- artifacts ----------------------------------------------------------

    def upload(self, fleet_id: str, upload: ArtifactUpload,
               parts: Iterable[bytes | UploadEnd]) -> Artifact:
        """Store the chunks of ``parts``; only a stream closed by an ``UploadEnd`` is complete."""
        artifact_id = new_id("art")
        path = check.artifact_path(fleet_id, upload.run_id, upload.step_id, artifact_id,
                                   upload.name)
        mime_type = check.short_text("mime_type", upload.mime_type or
                                     "application/octet-stream", check.MAX_MIME_LEN)
        if not MIME_TYPE.fullmatch(mime_type):
            raise InvalidArgument(f"mime_type {mime_type[:80]!r} is not a media type "
                                  "(type/subtype, optional ;name=value parameters, printable "
                                  "ASCII)", reason="INVALID_MIME_TYPE")
        metadata_json = self.limits.metadata(upload.metadata_json)
        if upload.expected_hash and len(upload.expected_hash) != 64:
            raise InvalidArgument("expected_hash must be a SHA-256 hex digest (64 characters)")
        received = CheckedUpload(upload, self.limits.check_upload)
        run = self.get_run(fleet_id, upload.run_id)
        if run.status is not RunStatus.RUNNING:
            raise FailedPrecondition(f"run {run.run_id!r} is stopped ({run.status.value}); "
                                     "it takes no more artifacts", reason="RUN_STOPPED")
        prior = self._in_session(self.repository.artifact_named, fleet_id, upload.run_id,
                                 upload.step_id, upload.name)
        if prior is not None:
            return self._same_upload(prior, upload, received, parts)
        info = self.blobs.put(path, received.chunks(parts), before_commit=received.check_hash)
        artifact = Artifact(artifact_id=artifact_id, run_id=upload.run_id,
                            step_id=upload.step_id, path=path, hash=info.sha256,
                            mime_type=mime_type, size_bytes=info.size_bytes,
                            created_us=now_us(), metadata_json=metadata_json)
        try:
            self._add_artifact(fleet_id, artifact, upload)
        except BaseException:
            self.blobs.delete(path)  # no row, so no blob: never an orphan from a failed insert
            raise
        self.blob_bytes.add("in", amount=info.size_bytes)
        return artifact

    def _same_upload(self, prior: Artifact, upload: ArtifactUpload, received: CheckedUpload,
                     parts: Iterable[bytes | UploadEnd]) -> Artifact:
        """The artifact already stored under this run, step and name, when these are its bytes
        (a retried upload whose reply was lost: it gets the first result, nothing is stored
        twice); ``ALREADY_EXISTS`` when they are other bytes."""
        if upload.expected_hash and upload.expected_hash.lower() != prior.hash:
            raise _artifact_exists(prior.artifact_id, upload)
        with open(os.devnull, "wb") as nowhere:  # hashed like a put, kept nowhere
            info = write_hashed(prior.path, received.chunks(parts), nowhere,
                                received.check_hash)
        if (info.sha256, info.size_bytes) != (prior.hash, prior.size_bytes):
            raise _artifact_exists(prior.artifact_id, upload)
        return prior

    def _add_artifact(self, fleet_id: str, artifact: Artifact, upload: ArtifactUpload) -> None:
        try:
            # The run held (as an append holds it): an erasure of the run cannot commit between
            # the check that it runs and the insert, leaving an artifact of an erased run.
            with self.writing() as session:
                self._running_run(session, fleet_id, artifact.run_id, lock=True)
                self.repository.add_artifact(session, fleet_id, artifact, upload.name)
        except DbIntegrityError:
            raise _artifact_exists("", upload) from None

    def get_artifact(self, fleet_id: str, artifact_id: str) -> Artifact:
        return self._in_session(self.repository.get_artifact, fleet_id,
                                check.identifier("artifact_id", artifact_id))

    def read(self, fleet_id: str, artifact_id: str,
             chunk_size: int = 1 << 20) -> tuple[Artifact, Iterator[bytes]]:
        """The artifact and its verified bytes; a mismatch raises IntegrityError at the end."""
        artifact = self.get_artifact(fleet_id, artifact_id)
        try:
            stream = self.blobs.open(artifact.path, chunk_size)
        except NotFound:
            self.get_artifact(fleet_id, artifact_id)  # erased meanwhile: NOT_FOUND, not a loss
            raise blob_missing_error(artifact) from None
        return artifact, self._counted(verified_read(artifact, stream))

    def _counted(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.blob_bytes.add("out", amount=len(chunk))
            yield chunk

    def list_artifacts(self, fleet_id: str, run_id: str, step_id: str, page_token: str,
                       page_size: int) -> tuple[list[Artifact], str]:
        return self.pages.paginate(page_token, page_size,
                        {"fleet": fleet_id, "run": run_id, "step": step_id},
                        lambda after, limit: self._in_run(
                            fleet_id, run_id, self.repository.list_artifacts, fleet_id, run_id,
                            step_id, after, limit),
                        lambda artifact: [artifact.created_us, artifact.artifact_id])

    def verify(self, fleet_id: str, run_id: str = "",
               active: Callable[[], bool] = lambda: True) -> tuple[int, list[ArtifactProblem]]:
        """Re-hash every blob (one run's when ``run_id`` is set), stopping when ``active``
        says the caller has gone (SCAN_ABANDONED)."""
        if run_id:
            self.get_run(fleet_id, run_id)
        checked, problems = 0, []
        artifacts = self._in_batches(
            lambda session, after, limit: self.repository.fleet_artifacts(
                session, fleet_id, run_id, after, limit),
            "", lambda artifact: artifact.artifact_id, ARTIFACT_BATCH)
        for artifact in while_wanted(artifacts, active):
            checked += 1
            problem = self._check_blob(fleet_id, artifact)
            if problem is not None:
                log.warning("artifact integrity problem", extra=problem.__dict__)
                self.integrity_failures.add(problem.problem)
                problems.append(problem)
        return checked, problems

    def verify_snapshots(self, fleet_id: str,
                         run_id: str = "", active: Callable[[], bool] = lambda: True
                         ) -> tuple[int, int, list[SnapshotProblem]]:
        """Re-hash every stored snapshot's state (one run's when ``run_id`` is set): how many
        were checked, how many of them are tombstones (erased in place, their state_hash kept
        and checked for form), and the problems; stops once ``active`` says the caller went."""
        if run_id:
            self.get_run(fleet_id, run_id)
        checked, tombstoned, problems = 0, 0, []
        snapshots = self._in_batches(
            lambda session, after, limit: self.repository.snapshot_problems(
                session, fleet_id, run_id, after, limit),
            "", lambda found: found[0], ARTIFACT_BATCH)
        for _snapshot_id, problem, erased in while_wanted(snapshots, active):
            checked += 1
            if problem is not None:
                log.warning("snapshot integrity problem", extra=problem.__dict__)
                self.integrity_failures.add(problem.problem)
                problems.append(problem)
            elif erased:
                tombstoned += 1
        return checked, tombstoned, problems

    def verify_manifests(self, fleet_id: str, run_id: str = "",
                         active: Callable[[], bool] = lambda: True
                         ) -> tuple[int, list[ManifestProblem]]:
        """Re-hash every stored manifest (one run's when ``run_id`` is set; else the fleet's,
        those built for no run too): how many were checked and the problems."""
        if run_id:
            self.get_run(fleet_id, run_id)
        checked, problems = 0, []
        manifests = self._in_batches(
            lambda session, after, limit: self.repository.list_manifests(
                session, fleet_id, run_id, after, limit),
            None, lambda manifest: [manifest.manifest_id], ARTIFACT_BATCH)
        for manifest in while_wanted(manifests, active):
            checked += 1
            problem = manifest_problem(manifest)
            if problem is not None:  # logged without its hashes (a plain one confirms guesses)
                log.warning("manifest integrity problem", extra={
                    "manifest_id": problem.manifest_id, "run_id": problem.run_id,
                    "problem": problem.problem})
                self.integrity_failures.add(problem.problem)
                problems.append(problem)
        return checked, problems

    def tombstones(self, fleet_id: str, run_id: str = "") -> Iterator[StoredTombstone]:
        """The fleet's runs erased whole (without ``run_id``), then every event and every
        snapshot of the fleet (of one run when ``run_id`` is set) erased in place, paged (one
        session a batch)."""
        if run_id:
            self.get_run(fleet_id, run_id)
        else:
            yield from self._in_batches(
                lambda session, after, limit: self.repository.run_tombstones(
                    session, fleet_id, after, limit),
                "", lambda found: found.run_id, ARTIFACT_BATCH)
        yield from self._in_batches(
            lambda session, after, limit: self.repository.event_tombstones(
                session, fleet_id, run_id, after, limit),
            ("", 0), lambda found: (found.run_id, int(found.id.rpartition(":")[2])),
            EVENT_BATCH)
        yield from self._in_batches(
            lambda session, after, limit: self.repository.snapshot_tombstones(
                session, fleet_id, run_id, after, limit),
            "", lambda found: found.id, ARTIFACT_BATCH)

    def verify_tombstones(self, fleet_id: str, run_id: str, source: ErasureSource | None,
                          active: Callable[[], bool] = lambda: True) -> TombstoneAudit:
        """Every tombstone of the fleet (of one run when ``run_id`` is set) checked against the
        erasure it names, as governance recorded it (``tombstone_audit``); each problem is
        counted as an integrity failure. Stops once ``active`` says the caller went."""
        audit = audit_tombstones(while_wanted(self.tombstones(fleet_id, run_id), active),
                                 source, fleet_id, self._recorded_erasures)
        for found in audit.problems:
            self.integrity_failures.add(found.problem)
        return audit

    def _check_blob(self, fleet_id: str, artifact: Artifact) -> ArtifactProblem | None:
        try:
            stream = self.blobs.open(artifact.path)
        except NotFound:
            if not self._still_stored(fleet_id, artifact.artifact_id):
                return None  # erased (ForgetRuns) since the batch was read: gone, not missing
            return blob_missing_problem(artifact)
        return blob_problem(artifact, stream)

    def _still_stored(self, fleet_id: str, artifact_id: str) -> bool:
        try:
            self.get_artifact(fleet_id, artifact_id)
        except NotFound:
            return False
        return True

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
            type=type, payload_json=self.limits.document("payload_json", payload_json),
            manifest_id=check.identifier("manifest_id", manifest_id) if manifest_id else "",
            artifact_ids=check.references("artifact_id", artifact_ids), agent_id=agent_id,
            request_id=check.identifier("request_id", request_id) if request_id else "")
        run_id, created_us = check.identifier("run_id", run_id), now_us()

        def append(session: Session) -> tuple[Event, bool]:
            # The run's lock first: a concurrent call with this request_id has committed by then.
            self.repository.get_run(session, fleet_id, run_id, lock=True)
            prior = find(session)
            if prior is not None:
                return prior, False
            run = self._running_run(session, fleet_id, run_id)
            self.check_references(session, fleet_id, draft.manifest_id, draft.artifact_ids)
            return self._append(session, run, draft, created_us), True

        def find(session: Session) -> Event | None:
            if not draft.request_id:
                return None
            prior = self.repository.event_for_request(session, fleet_id, run_id,
                                                      draft.request_id)
            if prior is not None and not prior.erased and (
                    prior.type, prior.payload_json, prior.manifest_id,
                    tuple(prior.artifact_ids)) != (draft.type, draft.payload_json,
                                                   draft.manifest_id, draft.artifact_ids):
                raise _request_id_reused(draft.request_id, "event", prior.seq)
            return prior

        return self._first_answer(append, find)

    def check_references(self, session: Session, fleet_id: str, manifest_id: str,
                          artifact_ids: tuple[str, ...]) -> None:
        if manifest_id and self.repository.get_manifest(session, fleet_id, manifest_id) is None:
            raise NotFound(f"manifest {manifest_id!r} not found; create it before referencing it",
                           reason="MANIFEST_NOT_FOUND", metadata={"manifest_id": manifest_id})
        if artifact_ids:
            found = self.repository.artifact_ids_in_fleet(session, fleet_id, artifact_ids)
            missing = [a for a in artifact_ids if a not in found]
            if missing:
                raise NotFound(f"artifacts not found in this fleet: {', '.join(missing[:5])}",
                               reason="ARTIFACT_NOT_FOUND",
                               metadata={"artifact_ids": ",".join(missing[:20])})

    def list_events(self, fleet_id: str, run_id: str, after_seq: int, page_token: str,
                    page_size: int) -> tuple[list[Event], str]:
        def fetch(after: list[Any] | None, limit: int) -> list[Event]:
            start = int(after[0]) if after else after_seq
            if start < 0:
                raise InvalidArgument("after_seq must be >= 0")
            checked = check.identifier("run_id", run_id)
            return self._in_run(fleet_id, checked, self.repository.events_after, fleet_id,
                                checked, start, limit)

        return self.pages.paginate(page_token, page_size,
                        {"fleet": fleet_id, "run": run_id, "after": after_seq}, fetch,
                        lambda event: [event.seq], _event_bytes, PAGE_BYTES)

    def replay(self, fleet_id: str, run_id: str) -> Iterator[Event]:
        """Every event from seq 1 to the run's head as read at the start, each checked against
        the hash chain as it passes (events appended meanwhile are the next replay's)."""
        run = self.get_run(fleet_id, check.identifier("run_id", run_id))
        try:
            yield from self._replayed(fleet_id, run)
        except IntegrityError:
            self.get_run(fleet_id, run.run_id)  # erased meanwhile: NOT_FOUND RUN_ERASED
            raise

    def _replayed(self, fleet_id: str, run: Run) -> Iterator[Event]:
        verifier = ChainVerifier(run.run_id)
        events = self._in_batches(
            lambda session, after, limit: self.repository.events_after(
                session, fleet_id, run.run_id, after, limit),
            0, lambda event: event.seq, REPLAY_BATCH)
        beyond = 0
        for event in events:
            if event.seq > run.event_count:
                beyond = event.seq
                break
            yield verifier.check(event)
        if beyond and self.get_run(fleet_id, run.run_id).event_count < beyond:
            raise IntegrityError(
                f"run {run.run_id}: the log holds event {beyond}, beyond the "
                f"{run.event_count} events the run records (an event was inserted outside "
                "the service)", reason="EVENT_CHAIN_BROKEN", metadata={"run_id": run.run_id})
        if verifier.length != run.event_count or verifier.head != run.head_hash:
            raise IntegrityError(
                f"run {run.run_id}: the log ends at {verifier.length} but the run records "
                f"{run.event_count} events (truncated log)", reason="EVENT_CHAIN_BROKEN",
                metadata={"run_id": run.run_id})

    def create_snapshot(self, fleet_id: str, run_id: str, state_json: str, seq: int = 0,
                        manifest_id: str = "", artifact_ids: tuple[str, ...] = (),
                        request_id: str = "") -> tuple[Snapshot, bool]:
        """The new snapshot; a retry with the same ``request_id`` gets the first one back."""
        if seq < 0:
            raise InvalidArgument("seq must be >= 0 (0 means the run's current head)")
        state = self.limits.document("state_json", state_json)
        draft = new_snapshot_state(Snapshot(
            snapshot_id=new_id("snap"), run_id=check.identifier("run_id", run_id), seq=seq,
            state_json=state, state_hash="",
            manifest_id=check.identifier("manifest_id", manifest_id) if manifest_id else "",
            artifact_ids=check.references("artifact_id", artifact_ids), created_us=now_us()))
        request_id = check.identifier("request_id", request_id) if request_id else ""

        def create(session: Session) -> tuple[Snapshot, bool]:
            self.repository.get_run(session, fleet_id, draft.run_id, lock=True)
            prior = find(session)
            if prior is not None:
                return prior, False
            run = self._running_run(session, fleet_id, draft.run_id)
            seq = draft.seq or run.event_count
            if seq > run.event_count or seq < 0:
                raise FailedPrecondition(
                    f"snapshot seq {seq} is past the run's last event ({run.event_count})",
                    reason="SNAPSHOT_AHEAD_OF_LOG")
            self.check_references(session, fleet_id, draft.manifest_id, draft.artifact_ids)
            snapshot = replace(draft, seq=seq)
            self.repository.add_snapshot(session, fleet_id, snapshot, request_id)
            return snapshot, True

        def find(session: Session) -> Snapshot | None:
            if not request_id:
                return None
            prior = self.repository.snapshot_for_request(session, fleet_id, draft.run_id,
                                                         request_id)
            if prior is not None and not prior.erased and (
                    (prior.state_json, prior.manifest_id, tuple(prior.artifact_ids))
                    != (draft.state_json, draft.manifest_id, draft.artifact_ids)
                    or (draft.seq and prior.seq != draft.seq)):
                raise _request_id_reused(request_id, "snapshot", prior.seq)
            return prior

        return self._first_answer(create, find)

    def _latest_snapshot(self, session: Session, fleet_id: str,
                         run_id: str) -> tuple[Run, Snapshot | None]:
        run = self.repository.get_run(session, fleet_id, run_id)
        if not run.latest_snapshot_id:
            return run, None
        snapshot = self.repository.get_snapshot(session, fleet_id, run.latest_snapshot_id)
        # The run names its latest snapshot by id: one gone, another run's, or past the run's
        # head was served as this run's state, or taken for "no snapshot" and every event
        # replayed (found by review on 2026-11-30, someone with the disk).
        if snapshot is None or snapshot.run_id != run.run_id or snapshot.seq > run.event_count:
            what = ("is missing" if snapshot is None else
                    f"belongs to run {snapshot.run_id!r}" if snapshot.run_id != run.run_id else
                    f"covers event {snapshot.seq}, past the run's head {run.event_count}")
            raise IntegrityError(f"run {run.run_id}'s latest snapshot {run.latest_snapshot_id} "
                                 f"{what}", reason="SNAPSHOT_MISMATCH",
                                 metadata={"run_id": run.run_id,
                                           "snapshot_id": run.latest_snapshot_id})
        return run, snapshot

    def latest_snapshot(self, fleet_id: str, run_id: str) -> Snapshot:
        _run, snapshot = self._in_session(self._latest_snapshot, fleet_id,
                                          check.identifier("run_id", run_id))
        if snapshot is None:
            raise NotFound(f"run {run_id!r} has no snapshot yet", reason="NO_SNAPSHOT")
        return snapshot

    def list_snapshots(self, fleet_id: str, run_id: str, page_token: str,
                       page_size: int) -> tuple[list[Snapshot], str]:
        return self.pages.paginate(page_token, page_size, {"fleet": fleet_id, "run": run_id},
                        lambda after, limit: self._in_run(
                            fleet_id, run_id, self.repository.list_snapshots, fleet_id, run_id,
                            after, limit),
                        lambda snapshot: [snapshot.created_us, snapshot.snapshot_id],
                        _snapshot_bytes, PAGE_BYTES)

    def rehydrate(self, fleet_id: str, agent_id: str, run_id: str,
                  max_events: int = 0) -> Rehydration:
        """Latest snapshot and the events after it: bounded reads, whatever the log's length."""
        if max_events < 0:
            raise InvalidArgument("max_events must be >= 0")
        limit = min(max_events or DEFAULT_REHYDRATE_EVENTS, MAX_REHYDRATE_EVENTS)
        with self.db.snapshot() as session:  # the run's head and its events at one moment
            run, snapshot = self._latest_snapshot(session, fleet_id,
                                                  check.identifier("run_id", run_id))
            events, more = self._events_within(session, fleet_id, run.run_id,
                                               snapshot.seq if snapshot is not None else 0,
                                               limit)
        _check_tail(run, snapshot.seq if snapshot is not None else 0, events,
                    complete=not more)
        manifest = None
        if snapshot is not None:
            if snapshot.manifest_id:
                self.resolve(fleet_id, agent_id, run.run_id,
                             Pointer(PointerType.MANIFEST, snapshot.manifest_id), critical=True)
                manifest = self._in_session(self.repository.get_manifest, fleet_id,
                                            snapshot.manifest_id)
            for artifact_id in snapshot.artifact_ids:
                self.resolve(fleet_id, agent_id, run.run_id,
                             Pointer(PointerType.ARTIFACT, artifact_id), critical=True)
        return Rehydration(run=run, snapshot=snapshot, events=events, truncated=more,
                           manifest=manifest)

    def _events_within(self, session: Session, fleet_id: str, run_id: str, after_seq: int,
                       limit: int) -> tuple[list[Event], bool]:
        """Up to ``limit`` events after ``after_seq`` and within ``REHYDRATE_BYTES`` (at least
        one), read a page at a time; and whether more follow. Before 2026-11-29 the events
        were read at once however large: 1,150 events of 61 KB made a reply over gRPC's
        64 MiB, and up to 100,000 could be held (found by a review)."""
        events: list[Event] = []
        size = 0
        while True:
            want = min(REHYDRATE_PAGE, limit + 1 - len(events))
            page = self.repository.events_after(session, fleet_id, run_id, after_seq, want)
            for event in page:
                cost = _event_bytes(event)
                if len(events) == limit or (events and size + cost > REHYDRATE_BYTES):
                    return events, True
                events.append(event)
                size += cost
            if len(page) < want:
                return events, False
            after_seq = page[-1].seq

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
            metadata_json=self.limits.metadata(metadata_json), created_us=now_us())

        def create(session: Session) -> tuple[Evidence, bool]:
            prior = find(session)
            if prior is not None:
                return prior, False
            if evidence.artifact_id:
                # The artifact's run held until the commit, as appends hold theirs: an erasure
                # of that run waits and then deletes this evidence too, or went first and the
                # run (so the artifact) is gone.
                # (ARTIFACT_NOT_FOUND from get_artifact; once the run is held, its artifacts
                # stay until the commit: erasing the run is what deletes them.)
                cited = self.repository.get_artifact(session, fleet_id, evidence.artifact_id)
                self.repository.get_run(session, fleet_id, cited.run_id, lock=True)
            self.repository.add_evidence(session, evidence)
            return evidence, True

        def find(session: Session) -> Evidence | None:
            return self.repository.get_evidence(session, fleet_id, evidence.evidence_id)

        return self._first_answer(create, find)

    def _get(self, query: Callable[[Session, str, str], R | None], fleet_id: str, kind: str,
             id_: str) -> R:
        """The ``kind`` (evidence, manifest) named ``id_``, or NotFound."""
        found = self._in_session(query, fleet_id, check.identifier(f"{kind}_id", id_))
        if found is None:
            raise NotFound(f"{kind} {id_!r} not found", reason=f"{kind.upper()}_NOT_FOUND")
        return found

    def get_evidence(self, fleet_id: str, evidence_id_: str) -> Evidence:
        return self._get(self.repository.get_evidence, fleet_id, "evidence", evidence_id_)

    def list_evidence(self, fleet_id: str, corpus_id: str, index_id: str, page_token: str,
                      page_size: int) -> tuple[list[Evidence], str]:
        return self.pages.paginate(page_token, page_size,
                        {"fleet": fleet_id, "corpus": corpus_id, "index": index_id},
                        lambda after, limit: self._in_session(
                            self.repository.list_evidence, fleet_id, corpus_id, index_id, after,
                            limit),
                        lambda evidence: [evidence.evidence_id])

    def create_manifest(self, fleet_id: str, content_json: str,
                        run_id: str = "") -> tuple[Manifest, bool]:
        """A format-2 manifest: a random id and the content's commitment under a new salt;
        the same content stored before (format 2 by its key, format 1 by its derived id)
        answers instead, created False."""
        content = self.limits.document("content_json", content_json, default="")
        run_id = check.identifier("run_id", run_id) if run_id else ""
        salt = new_salt()
        manifest = Manifest(fleet_id=fleet_id, manifest_id=new_manifest_id(), run_id=run_id,
                            content_json=content,
                            content_hash=commitment(salt, content.encode()),
                            created_us=now_us(), format=2, salt=salt)

        def create(session: Session) -> tuple[Manifest, bool]:
            key = key_of(session)
            prior = stored(session, key)
            if prior is not None:
                return prior, False
            if manifest.run_id:  # held until the commit: an erasure of the run waits for it
                self.repository.get_run(session, fleet_id, manifest.run_id, lock=True)
            self.repository.add_manifest(session, manifest)
            self.repository.add_manifest_key(session, fleet_id, key, manifest.manifest_id)
            return manifest, True

        def key_of(session: Session) -> str:
            return manifest_key(self.repository.fleet_secret(session, fleet_id), content)

        def stored(session: Session, key: str) -> Manifest | None:
            keyed = self.repository.manifest_by_key(session, fleet_id, key)
            if keyed is not None:
                return keyed
            # Stored before format 2 under the id its content gives; only such a one: an
            # imported format-2 manifest may carry any id of that form, another content's too.
            legacy = self.repository.get_manifest(session, fleet_id, manifest_id(content))
            return legacy if legacy is not None and legacy.format == 1 and \
                legacy.content_json == content else None

        return self._first_answer(create, lambda session: stored(session, key_of(session)))

    def get_manifest(self, fleet_id: str, manifest_id_: str) -> Manifest:
        found = self._get(self.repository.get_manifest, fleet_id, "manifest", manifest_id_)
        if not manifest_intact(found):
            raise IntegrityError(f"manifest {found.manifest_id} no longer matches its hash",
                                 reason="MANIFEST_HASH_MISMATCH")
        return found

    def list_manifests(self, fleet_id: str, run_id: str, page_token: str,
                       page_size: int) -> tuple[list[Manifest], str]:
        if run_id:
            check.identifier("run_id", run_id)
        return self.pages.paginate(page_token, page_size, {"fleet": fleet_id, "run": run_id},
                        lambda after, limit: self._in_session(
                            self.repository.list_manifests, fleet_id, run_id, after, limit),
                        lambda manifest: [manifest.manifest_id])

    # -- pointers and stop semantics ----------------------------------------

    def lookup(self, fleet_id: str, pointer: Pointer) -> Resolution:
        if pointer.type is PointerType.ARTIFACT:
            try:
                artifact = self._in_session(self.repository.get_artifact, fleet_id, pointer.id)
            except NotFound:
                return Resolution(False)
            return Resolution(self.blobs.exists(artifact.path), artifact.path, artifact.hash)
        if pointer.type is PointerType.EVIDENCE:
            evidence = self._in_session(self.repository.get_evidence, fleet_id, pointer.id)
            if evidence is None:
                return Resolution(False)
            if not evidence.artifact_id:
                return Resolution(True)
            return self.lookup(fleet_id, Pointer(PointerType.ARTIFACT, evidence.artifact_id))
        manifest = self._in_session(self.repository.get_manifest, fleet_id, pointer.id)
        if manifest is None:
            return Resolution(False)
        return Resolution(manifest_intact(manifest), "", manifest.content_hash)

    def resolve(self, fleet_id: str, agent_id: str, run_id: str, pointer: Pointer,
                critical: bool) -> Outcome:
        check.identifier(f"{pointer.type.value} id", pointer.id)
        run = self.get_run(fleet_id, check.identifier("run_id", run_id))
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
                stopped = self._stop(
                    fleet_id, run.run_id, RunStatus.SYSTEM_ERROR,
                    f"critical {pointer.type.value} {pointer.id} unresolved",
                    EventDraft(STOP_EVENT_TYPE,
                               unresolved_payload(pointer, outcome.resolution, outcome.attempts)),
                    now_us())
                status = stopped.status
            except FailedPrecondition:
                status = self.get_run(fleet_id, run.run_id).status
        raise NotFound(
            f"critical {pointer.type.value} {pointer.id} could not be resolved after "
            f"{outcome.attempts} attempts; run {run.run_id} is {status.value}",
            reason="CRITICAL_POINTER_UNRESOLVED",
            metadata={**diagnostics, "run_status": status.value})


def _request_id_reused(request_id: str, what: str, seq: int) -> AlreadyExists:
    """A request id sent again with another body: refused, as the shard and the compactor
    refuse it. Before 2026-11-29 the first call's answer came back and the new body was
    dropped without a word (found by a review)."""
    return AlreadyExists(
        f"request_id {request_id!r} already made the {what} at seq {seq} of this run with "
        f"other content; use a new request_id for a new {what}", reason="REQUEST_ID_REUSED",
        metadata={"seq": str(seq)})


def _event_bytes(event: Event) -> int:
    """About what an event adds to a reply: its payload, its ids and hashes."""
    return (_utf8_len(event.payload_json) + len(event.type) + 64 * len(event.artifact_ids)
            + len(event.manifest_id) + 256)


def _snapshot_bytes(snapshot: Snapshot) -> int:
    """About what a snapshot adds to a reply: its state, its ids and hashes."""
    return (_utf8_len(snapshot.state_json) + 64 * len(snapshot.artifact_ids)
            + len(snapshot.manifest_id) + 256)


def _utf8_len(text: str) -> int:
    """``text``'s UTF-8 size, without encoding an ASCII text to learn it."""
    return len(text) if text.isascii() else len(text.encode())


def _check_tail(run: Run, after_seq: int, events: list[Event], complete: bool) -> None:
    """The events after seq ``after_seq``, each re-hashed (format 2: its commitment from payload
    and salt) and linked to the one before; a ``complete`` tail must end at the run's head."""
    verifier = ChainVerifier(run.run_id, events[0].prev_hash if events and after_seq else "",
                             after_seq)
    verifier.check_all(events)
    if complete and (verifier.length != run.event_count or
                     (events and verifier.head != run.head_hash)):
        raise IntegrityError(
            f"run {run.run_id}: the events after seq {after_seq} do not end at the run's head "
            f"({run.event_count} events; altered or removed events)",
            reason="EVENT_CHAIN_BROKEN", metadata={"run_id": run.run_id})


def _artifact_exists(artifact_id: str, upload: ArtifactUpload) -> AlreadyExists:
    holder = f"artifact {artifact_id}" if artifact_id else "an artifact"
    return AlreadyExists(
        f"{holder} already holds {upload.name!r} in step {upload.step_id!r} of run "
        f"{upload.run_id!r}", reason="ARTIFACT_EXISTS",
        metadata={"artifact_id": artifact_id, "run_id": upload.run_id,
                  "step_id": upload.step_id, "name": upload.name})
