"""Runs written on another instance, stored as they were there (``engram import-bundle``).

An import keeps what the origin made: ids, authors, times, statuses and the event chain's
hashes. So nothing is taken on trust: every item is checked as this service would have made
it (an evidence's id derives from where it points, a manifest's id and hash from its
content, or for format 2 its hash commits to its content under its salt, an event's hash recomputes
and the event extends its run's stored chain, a snapshot's state hashes to its state_hash,
an artifact's bytes to its hash and size), held to this service's limits, and refused with
nothing stored when it is not. An identical item already stored is left alone and counted,
so running an import again, or again after it was cut off, completes it and changes nothing
else. Imports take the writer's turn (:meth:`ArtifactsService.writing`) and lock the run's
row, as appends and erasures do, so an erasure and an import of one run never interleave.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any

from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session

from engram.client.artifacts import MIME_TYPE
from services.artifacts.domain import validation as check
from services.artifacts.domain.chain import (
    FORMATS,
    event_intact,
    evidence_id,
    expected_state_hash,
    manifest_intact,
    manifest_key,
    tombstone_intact,
)
from services.artifacts.domain.entities import (
    Artifact,
    ArtifactProblem,
    Event,
    Evidence,
    Manifest,
    Run,
    RunStatus,
    Snapshot,
)
from services.artifacts.domain.integrity import (
    ArtifactUpload,
    CheckedUpload,
    UploadEnd,
    blob_missing_problem,
    blob_problem,
)
from services.artifacts.service import ArtifactsService
from services.artifacts.tables import ManifestKeyRow
from services.common.erasure_source import ErasureSource, is_erasure_id, recorded_erasure
from services.common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from services.common.limits import check_limit

log = logging.getLogger("engram.artifacts")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_STOP_REASON = 1024
MAX_KEY_ID = 64
"""Artifact and snapshot ids are keys of 64 characters in the store (an import keeps the
origin's; the service makes its own shorter)."""


@contextmanager
def _erased_is_final() -> Iterator[None]:
    """An erased run refuses an import as FAILED_PRECONDITION (it will never come back), not
    NOT_FOUND (which reads as "import the run first")."""
    try:
        yield
    except NotFound as error:
        if error.reason != "RUN_ERASED":
            raise
        raise FailedPrecondition(f"{error.message}; an erased run is not brought back",
                                 reason="RUN_ERASED") from None


def _key_id(kind: str, value: str) -> str:
    check.identifier(kind, value)
    if len(value) > MAX_KEY_ID:
        raise InvalidArgument(f"{kind} is {len(value)} characters; at most {MAX_KEY_ID}",
                              reason="INVALID_IDENTIFIER")
    return value


@dataclass(frozen=True)
class ImportCounts:
    created: int = 0
    already_present: int = 0

    def __add__(self, other: ImportCounts) -> ImportCounts:
        return ImportCounts(self.created + other.created,
                            self.already_present + other.already_present)


_CREATED, _PRESENT = ImportCounts(1, 0), ImportCounts(0, 1)


def _time(kind: str, micros: int, *, required: bool = True) -> int:
    if micros < 0 or (required and micros == 0):
        raise InvalidArgument(f"{kind} must be a time after 1970 (the origin's own)",
                              reason="INVALID_CREATE_TIME")
    return micros


def _canonical(kind: str, text: str, canonical: str) -> str:
    """``text`` when it is already in the form this service stores; refused otherwise (an
    altered form would not hash, or re-export, as it did at the origin)."""
    if text != canonical:
        raise InvalidArgument(f"{kind} is not in canonical JSON form (sorted keys, no spaces) "
                              "as the origin stored it", reason="NOT_CANONICAL")
    return text


def _format(what: str, format: int) -> None:
    if format not in FORMATS:
        raise InvalidArgument(f"{what}: format {format} is not one this service stores "
                              f"({', '.join(map(str, FORMATS))})", reason="INVALID_FORMAT")


def _conflict(kind: str, item_id: str) -> AlreadyExists:
    return AlreadyExists(f"{kind} {item_id!r} is already stored here with other content; "
                         "nothing of this import call was stored",
                         reason=f"{kind.upper()}_CONFLICT", metadata={f"{kind}_id": item_id})


class _BytesReplaced(Aborted):
    """An import's bytes replaced by a concurrent import of the same id before its row."""


class RunImports:
    """The import use cases over an :class:`ArtifactsService`'s stores."""

    def __init__(self, service: ArtifactsService,
                 erasures: ErasureSource | None = None) -> None:
        self.service = service
        self.erasures = erasures
        """Where an imported tombstone's erasure is looked up (governance)."""
        self.repository = service.repository
        self.limits = service.limits

    # -- runs ---------------------------------------------------------------

    def import_run(self, fleet_id: str, run: Run) -> tuple[Run, bool]:
        checked = self._checked_run(fleet_id, run)
        try:
            with self.service.writing() as session:
                prior = self._stored_run(session, fleet_id, checked.run_id)
                if prior is not None:
                    return self._same_run(prior, checked), False
                self.repository.add_run(session, checked)
                session.flush()
                # After the insert, as StartRun: an erasure of this id has committed by now.
                erased = self.repository.run_tombstone(session, fleet_id, checked.run_id)
                if erased is not None:
                    raise FailedPrecondition(
                        f"run {checked.run_id!r} was erased here (erasure {erased}); an "
                        "erased run is not brought back", reason="RUN_ERASED")
            return checked, True
        except DbIntegrityError:  # a concurrent import or StartRun of this id came first
            return self._same_run(self.service.get_run(fleet_id, checked.run_id), checked), False

    def _checked_run(self, fleet_id: str, run: Run) -> Run:
        if run.fleet_id and run.fleet_id != fleet_id:
            raise PermissionDenied(
                f"run {run.run_id[:128]!r} belongs to fleet {run.fleet_id[:128]!r}; this token "
                f"imports into fleet {fleet_id!r} only", reason="FLEET_MISMATCH")
        stopped = _time("stop_time", run.stopped_us, required=False)
        if (run.status is RunStatus.RUNNING) != (stopped == 0):
            raise InvalidArgument("a running run has no stop_time and a stopped one has one",
                                  reason="INVALID_RUN")
        return Run(run_id=check.identifier("run_id", run.run_id), fleet_id=fleet_id,
                   agent_id=check.identifier("agent_id", run.agent_id), status=run.status,
                   stop_reason=check.short_text("stop_reason", run.stop_reason,
                                                MAX_STOP_REASON),
                   created_us=_time("create_time", run.created_us), stopped_us=stopped,
                   event_count=0, head_hash="", latest_snapshot_id="",
                   metadata_json=_canonical("metadata_json", run.metadata_json,
                                            self.limits.metadata(run.metadata_json)))

    def _stored_run(self, session: Session, fleet_id: str, run_id: str) -> Run | None:
        try:
            return self.repository.get_run(session, fleet_id, run_id, lock=True)
        except NotFound as error:
            if error.reason == "RUN_ERASED":
                raise FailedPrecondition(
                    f"{error.message}; an erased run is not brought back",
                    reason="RUN_ERASED") from None
            return None

    @staticmethod
    def _same_run(stored: Run, wanted: Run) -> Run:
        fields = ("agent_id", "status", "stop_reason", "created_us", "stopped_us",
                  "metadata_json")
        if any(getattr(stored, name) != getattr(wanted, name) for name in fields):
            raise _conflict("run", wanted.run_id)
        return stored

    # -- artifacts ----------------------------------------------------------

    def import_artifact(self, fleet_id: str, artifact: Artifact,
                        parts: Iterable[bytes | UploadEnd]) -> tuple[Artifact, bool]:
        """Store ``artifact`` with the bytes of ``parts``, which must be its own."""
        wanted, name = self._checked_artifact(fleet_id, artifact)
        with _erased_is_final():
            prior = self._stored_artifact(fleet_id, wanted.artifact_id)
            if prior is not None:
                if prior != wanted:
                    raise _conflict("artifact", wanted.artifact_id)
                return prior, False  # the bytes are not read again: checked on the way in
            self.service.get_run(fleet_id, wanted.run_id)
            with self.service.db.session() as session:
                named = self.repository.artifact_named(session, fleet_id, wanted.run_id,
                                                       wanted.step_id, name)
            if named is not None:
                raise AlreadyExists(
                    f"artifact {named.artifact_id} already holds {name!r} in step "
                    f"{wanted.step_id!r} of run {wanted.run_id!r}", reason="ARTIFACT_EXISTS",
                    metadata={"artifact_id": named.artifact_id})
            mine = self._store_blob(fleet_id, wanted, name, parts)
            try:
                with self.service.writing() as session:
                    # The run held: an erasure cannot commit between the check and the insert,
                    # nor a concurrent import remove the blob (_drop_unowned holds it too).
                    self.repository.get_run(session, fleet_id, wanted.run_id, lock=True)
                    # Its own bytes still: a concurrent import of this id with other bytes may
                    # have removed them and put its own meanwhile.
                    if not self._still_mine(wanted, mine):
                        raise _BytesReplaced(
                            f"artifact {wanted.artifact_id}: a concurrent import of this id with "
                            "other bytes replaced them before this one was recorded; nothing "
                            "was stored, send it again", reason="CONCURRENT_WRITE")
                    self.repository.add_artifact(session, fleet_id, wanted, name)
            except DbIntegrityError:
                stored = self._stored_artifact(fleet_id, wanted.artifact_id)
                if stored == wanted:  # a concurrent import of this very artifact came first
                    return stored, False
                self._drop_unowned(fleet_id, wanted)
                if stored is not None:
                    raise _conflict("artifact", wanted.artifact_id) from None
                with self.service.db.session() as session:
                    taken = self.repository.artifact_id_taken(session, wanted.artifact_id)
                if taken:  # by another fleet: say nothing of it
                    raise FailedPrecondition(
                        f"artifact id {wanted.artifact_id!r} is taken on this instance; it "
                        "cannot be imported under it", reason="ID_TAKEN") from None
                raise AlreadyExists(  # a concurrent write of another artifact, same name
                    f"another artifact already holds {name!r} in step {wanted.step_id!r} of "
                    f"run {wanted.run_id!r}", reason="ARTIFACT_EXISTS") from None
            except _BytesReplaced:
                raise  # the bytes at the key are the other import's: left to it
            except BaseException:
                self._drop_unowned(fleet_id, wanted)  # a retry stores it again
                raise
        self.service.blob_bytes.add("in", amount=wanted.size_bytes)
        return wanted, True

    def _store_blob(self, fleet_id: str, wanted: Artifact, name: str,
                    parts: Iterable[bytes | UploadEnd]) -> str | None:
        """The bytes at the artifact's own key; their version (BlobStore.version, None when the
        store cannot tell). A blob already there is what an import that failed after storing it
        left (a crash, the database gone), or a concurrent import's of the same id: its bytes
        passed the same hash check, so it is kept when they are this artifact's; when they are
        not, it is removed unless a row holds it (the import is then sent again), and a row
        holding it is a conflict."""
        upload = ArtifactUpload(run_id=wanted.run_id, step_id=wanted.step_id, name=name,
                                mime_type=wanted.mime_type, metadata_json=wanted.metadata_json,
                                expected_size_bytes=wanted.size_bytes,
                                expected_hash=wanted.hash)
        received = CheckedUpload(upload, self.limits.check_upload)
        blobs = self.service.blobs
        try:
            return blobs.put(wanted.path, received.chunks(parts),
                             before_commit=received.check_hash).version
        except AlreadyExists:
            removed = Aborted(f"artifact {wanted.artifact_id}: a concurrent import of this id "
                              "removed the bytes found under its key; send it again",
                              reason="CONCURRENT_WRITE")
            try:
                found = blobs.version(wanted.path)
            except NotFound:
                raise removed from None
            if self._blob_problem(wanted) is None:
                # The bytes are there already (checked just now, unless replaced meanwhile);
                # the put that left them may have been killed before its fsyncs.
                try:
                    if found is not None and blobs.version(wanted.path) != found:
                        raise removed
                    blobs.make_durable(wanted.path)
                except NotFound:
                    raise removed from None
                return found
            if not self._drop_unowned(fleet_id, wanted):
                raise _conflict("artifact", wanted.artifact_id) from None
            raise Aborted(f"artifact {wanted.artifact_id}: an earlier import left other bytes "
                          "under its key; they were removed, send it again",
                          reason="CONCURRENT_WRITE") from None

    def _still_mine(self, wanted: Artifact, mine: str | None) -> bool:
        """Whether the blob at ``wanted``'s key is still the one this import stored or checked:
        its version unchanged, or, for a store that cannot tell, its bytes read again (under
        the run's lock: a store's version spares hashing a large blob there)."""
        if mine is None:
            return self._blob_problem(wanted) is None
        try:
            return self.service.blobs.version(wanted.path) == mine
        except NotFound:
            return False

    def _blob_problem(self, wanted: Artifact) -> ArtifactProblem | None:
        """What is wrong with the bytes at ``wanted``'s key (missing, other size or hash), or
        None when they are its own."""
        try:
            return blob_problem(wanted, self.service.blobs.open(wanted.path))
        except NotFound:
            return blob_missing_problem(wanted)

    def _drop_unowned(self, fleet_id: str, wanted: Artifact) -> bool:
        """Remove the blob at ``wanted``'s key, unless a stored row holds it; whether it was
        removed. Under the run's lock, which the insert of an import also takes (checking its
        blob is still there): two imports of one id at once each found no row, and the one
        that lost removed the bytes of the one already answered (found in review,
        2026-11-30)."""
        try:
            with self.service.writing() as session:
                self.repository.get_run(session, fleet_id, wanted.run_id, lock=True)
                if self.repository.artifact_key(session, wanted.artifact_id) == wanted.path:
                    return False
                self._drop_blob(wanted.path)
                return True
        except NotFound:  # the run erased meanwhile: its erasure sweeps its keys
            self._drop_blob(wanted.path)
            return True

    def _drop_blob(self, path: str) -> None:
        try:
            self.service.blobs.delete(path)
        except Exception:  # a blob left behind is adopted or replaced by the next import
            log.warning("could not remove an imported blob after a failed insert",
                        exc_info=True, extra={"path": path})

    def _checked_artifact(self, fleet_id: str, artifact: Artifact) -> tuple[Artifact, str]:
        artifact_id = _key_id("artifact_id", artifact.artifact_id)
        run_id = check.identifier("run_id", artifact.run_id)
        step_id = check.identifier("step_id", artifact.step_id)
        name = _artifact_name(fleet_id, run_id, step_id, artifact_id, artifact.path)
        if not _SHA256.fullmatch(artifact.hash):
            raise InvalidArgument("hash must be the SHA-256 of the bytes, 64 lowercase hex "
                                  "characters", reason="INVALID_HASH")
        if artifact.size_bytes < 0:
            raise InvalidArgument("size_bytes must be >= 0", reason="INVALID_SIZE")
        self.limits.check_upload(artifact.size_bytes)
        mime_type = check.short_text("mime_type", artifact.mime_type, check.MAX_MIME_LEN)
        if not MIME_TYPE.fullmatch(mime_type):
            raise InvalidArgument(f"mime_type {mime_type[:80]!r} is not a media type",
                                  reason="INVALID_MIME_TYPE")
        return Artifact(
            artifact_id=artifact_id, run_id=run_id, step_id=step_id,
            # This instance's key for it, whatever the origin's was: a key names the fleet,
            # so an import never writes where another fleet's blob lives.
            path=check.artifact_path(fleet_id, run_id, step_id, artifact_id, name),
            hash=artifact.hash, mime_type=mime_type, size_bytes=artifact.size_bytes,
            created_us=_time("create_time", artifact.created_us),
            metadata_json=_canonical("metadata_json", artifact.metadata_json,
                                     self.limits.metadata(artifact.metadata_json))), name

    def _stored_artifact(self, fleet_id: str, artifact_id: str) -> Artifact | None:
        try:
            return self.service.get_artifact(fleet_id, artifact_id)
        except NotFound:
            return None

    # -- manifests, evidence, events, snapshots ----------------------------

    def import_items(self, fleet_id: str, manifests: list[Manifest], evidence: list[Evidence],
                     events: list[Event], snapshots: list[Snapshot]) -> ImportCounts:
        """All of them in one transaction, or none (the first refusal names its item)."""
        total = len(manifests) + len(evidence) + len(events) + len(snapshots)
        if total == 0:
            raise InvalidArgument("an import call carries at least one item",
                                  reason="EMPTY_BATCH")
        check_limit("items in one import call", total, self.limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS", reason="BATCH_TOO_LARGE")
        manifests = [self._checked_manifest(fleet_id, m) for m in manifests]
        evidence = [self._checked_evidence(fleet_id, e) for e in evidence]
        events = sorted((self._checked_event(e) for e in events),
                        key=lambda e: (e.run_id, e.seq))
        snapshots = [self._checked_snapshot(s) for s in snapshots]
        self._tombstones_listed(fleet_id, events, snapshots)
        try:
            with _erased_is_final(), self.service.writing() as session:
                counts = ImportCounts()
                secret = functools.cache(lambda: self.repository.fleet_secret(session, fleet_id))
                for manifest in manifests:
                    counts += self._manifest(session, fleet_id, manifest, secret)
                for item in evidence:
                    counts += self._evidence(session, fleet_id, item)
                for run_id, run_events in groupby(events, key=lambda e: e.run_id):
                    counts += self._events(session, fleet_id, run_id, list(run_events))
                for snapshot in snapshots:
                    counts += self._snapshot(session, fleet_id, snapshot)
                return counts
        except DbIntegrityError:
            raise Aborted("a concurrent import stored some of these items first; nothing of "
                          "this call was stored, send it again", reason="CONCURRENT_WRITE"
                          ) from None

    def _checked_manifest(self, fleet_id: str, manifest: Manifest) -> Manifest:
        content = _canonical("content_json", manifest.content_json,
                             self.limits.document("content_json", manifest.content_json,
                                                  default=""))
        format_ = manifest.format or 1  # a bundle made before format 2 carries none
        if format_ not in FORMATS:
            raise InvalidArgument(f"manifest {manifest.manifest_id[:80]!r}: format must be one "
                                  f"of {FORMATS}, got {manifest.format}",
                                  reason="MANIFEST_HASH_MISMATCH")
        checked = replace(manifest, fleet_id=fleet_id, content_json=content, format=format_,
                          salt=manifest.salt if format_ == 2 else "",
                          run_id=check.identifier("run_id", manifest.run_id)
                          if manifest.run_id else "",
                          created_us=_time("create_time", manifest.created_us))
        if not manifest_intact(checked):
            raise InvalidArgument(f"manifest {manifest.manifest_id[:80]!r}: its id and "
                                  "content_hash must derive from its content_json (format 1), "
                                  "or its content_hash commit to it under its salt and its id "
                                  "be mf_ and 40 hex digits (format 2); altered?",
                                  reason="MANIFEST_HASH_MISMATCH")
        return checked

    def _checked_evidence(self, fleet_id: str, evidence: Evidence) -> Evidence:
        for kind in ("corpus_id", "index_id", "chunk_id"):
            check.identifier(kind, getattr(evidence, kind))
        if evidence.span_start < 0 or evidence.span_end < evidence.span_start:
            raise InvalidArgument(f"span [{evidence.span_start}, {evidence.span_end}) must "
                                  "satisfy 0 <= start <= end", reason="INVALID_SPAN")
        if evidence.evidence_id != evidence_id(evidence.corpus_id, evidence.index_id,
                                               evidence.chunk_id, evidence.span_start,
                                               evidence.span_end):
            raise InvalidArgument(f"evidence {evidence.evidence_id[:80]!r}: its id must derive "
                                  "from its corpus, index, chunk and span (altered?)",
                                  reason="EVIDENCE_ID_MISMATCH")
        return replace(
            evidence, fleet_id=fleet_id,
            artifact_id=check.identifier("artifact_id", evidence.artifact_id)
            if evidence.artifact_id else "",
            metadata_json=_canonical("metadata_json", evidence.metadata_json,
                                     self.limits.metadata(evidence.metadata_json)),
            created_us=_time("create_time", evidence.created_us))

    def _tombstones_listed(self, fleet_id: str, events: list[Event],
                           snapshots: list[Snapshot]) -> None:
        """An event or snapshot erased in place (a tombstone) is imported only when an erasure
        governance holds for this fleet lists it under its kept hash: nobody plants a tombstone
        to keep an item's content away (FAILED_PRECONDITION TOMBSTONE_NOT_IN_ERASURE)."""
        wanted = [("event", f"{e.run_id}:{e.seq}", e.hash, e.erasure_id)
                  for e in events if e.erased] + \
                 [("snapshot", s.snapshot_id, s.state_hash, s.erasure_id)
                  for s in snapshots if s.erased]
        orders: dict[str, set[tuple[str, str, str]]] = {}
        for kind, item_id, leaf, erasure_id in wanted:
            if erasure_id not in orders:
                order = recorded_erasure(self.erasures, "artifacts", erasure_id, fleet_id)
                orders[erasure_id] = set(order.items)
            if (kind, item_id, leaf) not in orders[erasure_id]:
                raise FailedPrecondition(
                    f"{kind} {item_id} is a tombstone of erasure {erasure_id}, which does not "
                    "list it under that hash; import the fleet's erasures first",
                    reason="TOMBSTONE_NOT_IN_ERASURE",
                    metadata={"kind": kind, "id": item_id, "erasure_id": erasure_id})

    def _checked_event(self, event: Event) -> Event:
        check.identifier("run_id", event.run_id)
        if event.seq < 1:
            raise InvalidArgument(f"run {event.run_id}: event seq {event.seq} must be >= 1",
                                  reason="INVALID_SEQ")
        if not event.type.strip():
            raise InvalidArgument("an event needs a type")
        check.short_text("type", event.type, check.MAX_TYPE_LEN)
        if event.erased:  # a tombstone: no payload; event_intact below checks its form
            _tombstone_fields(f"run {event.run_id}: event {event.seq}", event.erasure_id,
                              event.erased_us, event.erased_by)
        else:
            _no_tombstone_fields(event.erased_us, event.erased_by)
            _canonical("payload_json", event.payload_json,
                       self.limits.document("payload_json", event.payload_json))
        if event.manifest_id:
            check.identifier("manifest_id", event.manifest_id)
        check.references("artifact_id", event.artifact_ids)
        if event.agent_id:  # the service's own events (a stop after a lost pointer) have none
            check.identifier("agent_id", event.agent_id)
        _time("create_time", event.created_us)
        _format(f"run {event.run_id}: event {event.seq}", event.format)
        # Format 2: the commitment must recompute from payload and salt, the hash from it.
        if not _SHA256.fullmatch(event.prev_hash or "0" * 64) or \
                not event_intact(event, event.prev_hash):
            raise InvalidArgument(f"run {event.run_id}: event {event.seq} does not match its "
                                  "hash (altered?)", reason="EVENT_HASH_MISMATCH",
                                  metadata={"run_id": event.run_id, "seq": str(event.seq)})
        return event

    def _checked_snapshot(self, snapshot: Snapshot) -> Snapshot:
        _key_id("snapshot_id", snapshot.snapshot_id)
        check.identifier("run_id", snapshot.run_id)
        if snapshot.seq < 0:
            raise InvalidArgument("a snapshot's seq must be >= 0", reason="INVALID_SEQ")
        _format(f"snapshot {snapshot.snapshot_id}", snapshot.format)
        if snapshot.erased:
            _tombstone_fields(f"snapshot {snapshot.snapshot_id}", snapshot.erasure_id,
                              snapshot.erased_us, snapshot.erased_by)
            intact = tombstone_intact(snapshot.format, snapshot.salt, snapshot.state_json,
                                      snapshot.state_hash, erasure_id=snapshot.erasure_id,
                                      erased_us=snapshot.erased_us)
        else:
            _no_tombstone_fields(snapshot.erased_us, snapshot.erased_by)
            state = _canonical("state_json", snapshot.state_json,
                               self.limits.document("state_json", snapshot.state_json))
            intact = snapshot.state_hash == expected_state_hash(snapshot.format, snapshot.salt,
                                                                state)
        if not intact:
            raise InvalidArgument(f"snapshot {snapshot.snapshot_id}: its state does not match "
                                  "its state_hash (altered?)", reason="SNAPSHOT_HASH_MISMATCH")
        if snapshot.manifest_id:
            check.identifier("manifest_id", snapshot.manifest_id)
        check.references("artifact_id", snapshot.artifact_ids)
        _time("create_time", snapshot.created_us)
        return snapshot

    def _manifest(self, session: Session, fleet_id: str, manifest: Manifest,
                  secret: Callable[[], bytes]) -> ImportCounts:
        """``secret``: the fleet's manifest-key secret (read once a call, when first needed)."""
        prior = self.repository.get_manifest(session, fleet_id, manifest.manifest_id)
        if prior is not None:
            if prior != manifest:
                raise _conflict("manifest", manifest.manifest_id)
            return _PRESENT
        if manifest.run_id:  # held, as an append holds it: an erasure of the run waits
            self.repository.get_run(session, fleet_id, manifest.run_id, lock=True)
        self.repository.add_manifest(session, manifest)
        if manifest.format == 2:  # found by its content here too, unless another holds it
            self.service.db.insert_once(session, ManifestKeyRow, dict(
                fleet_id=fleet_id, manifest_id=manifest.manifest_id,
                key=manifest_key(secret(), manifest.content_json)))
        session.flush()
        return _CREATED

    def _evidence(self, session: Session, fleet_id: str, evidence: Evidence) -> ImportCounts:
        prior = self.repository.get_evidence(session, fleet_id, evidence.evidence_id)
        if prior is not None:
            if prior != evidence:
                raise _conflict("evidence", evidence.evidence_id)
            return _PRESENT
        if evidence.artifact_id:
            self.service.check_references(session, fleet_id, "", (evidence.artifact_id,))
            # The cited artifact's run held: its erasure deletes the evidence citing it.
            cited = self.repository.get_artifact(session, fleet_id, evidence.artifact_id)
            self.repository.get_run(session, fleet_id, cited.run_id, lock=True)
        self.repository.add_evidence(session, evidence)
        session.flush()
        return _CREATED

    def _events(self, session: Session, fleet_id: str, run_id: str,
                events: list[Event]) -> ImportCounts:
        run = self.repository.get_run(session, fleet_id, run_id, lock=True)
        counts = ImportCounts()
        for event in events:
            if event.seq <= run.event_count:
                stored = self.repository.events_after(session, fleet_id, run_id,
                                                      event.seq - 1, 1)
                if not stored or not _same_item(stored[0], event):
                    raise _conflict("event", f"{run_id}/{event.seq}")
                counts += _PRESENT
                continue
            if event.seq != run.event_count + 1 or event.prev_hash != run.head_hash:
                raise FailedPrecondition(
                    f"run {run_id}: event {event.seq} does not extend the stored chain, which "
                    f"holds {run.event_count} events; import a run's events in order from seq "
                    f"{run.event_count + 1}", reason="EVENT_CHAIN_GAP",
                    metadata={"run_id": run_id, "seq": str(event.seq),
                              "stored": str(run.event_count)})
            self.service.check_references(session, fleet_id, event.manifest_id,
                                           event.artifact_ids)
            self.repository.add_event(session, fleet_id, event, "")
            run = replace(run, event_count=event.seq, head_hash=event.hash)
            counts += _CREATED
        session.flush()
        return counts

    def _snapshot(self, session: Session, fleet_id: str, snapshot: Snapshot) -> ImportCounts:
        prior = self.repository.get_snapshot(session, fleet_id, snapshot.snapshot_id)
        if prior is not None:
            if not _same_item(prior, snapshot):
                raise _conflict("snapshot", snapshot.snapshot_id)
            return _PRESENT
        run = self.repository.get_run(session, fleet_id, snapshot.run_id, lock=True)
        if snapshot.seq > run.event_count:
            raise FailedPrecondition(
                f"snapshot {snapshot.snapshot_id} is at seq {snapshot.seq}, past the "
                f"{run.event_count} events stored for run {run.run_id}: import its events "
                "first", reason="SNAPSHOT_AHEAD_OF_LOG")
        self.service.check_references(session, fleet_id, snapshot.manifest_id,
                                       snapshot.artifact_ids)
        if self.repository.snapshot_id_taken(session, snapshot.snapshot_id):
            raise FailedPrecondition(f"snapshot id {snapshot.snapshot_id!r} is taken on this "
                                     "instance; it cannot be imported under it",
                                     reason="ID_TAKEN")
        latest = (self.repository.get_snapshot(session, fleet_id, run.latest_snapshot_id)
                  if run.latest_snapshot_id else None)
        self.repository.add_snapshot(session, fleet_id, snapshot, "")
        if latest is not None and (latest.created_us, latest.snapshot_id) > (
                snapshot.created_us, snapshot.snapshot_id):
            # Imported out of creation order: the run's latest stays the newest, as at the origin.
            self.repository.set_latest_snapshot(session, fleet_id, run.run_id,
                                                latest.snapshot_id)
        session.flush()
        return _CREATED


def _same_item(stored: Event | Snapshot, wanted: Event | Snapshot) -> bool:
    """The same event or snapshot, or the same one with one of the two erased in place: a
    tombstone stored here is not brought back by an older copy, and a stored copy whose
    tombstone arrives is erased when the import carries the erasure out (its last step)."""
    if stored == wanted:
        return True
    if stored.erased == wanted.erased:
        return False
    content = "payload_json" if isinstance(stored, Event) else "state_json"
    blank: dict[str, Any] = {content: "", "salt": "", "erasure_id": "", "erased_us": 0,
                             "erased_by": ""}
    return replace(stored, **blank) == replace(wanted, **blank)


def _tombstone_fields(what: str, erasure_id: str, erased_us: int, erased_by: str) -> None:
    if not is_erasure_id(erasure_id) or erased_us <= 0:
        raise InvalidArgument(f"{what}: a tombstone names its erasure (era_ and 28 lowercase "
                              "hex digits) and when it was erased", reason="INVALID_TOMBSTONE")
    if erased_by:
        check.identifier("erased_by", erased_by)
    check.identifier("erasure_id", erasure_id)


def _no_tombstone_fields(erased_us: int, erased_by: str) -> None:
    if erased_us or erased_by:
        raise InvalidArgument("erase_time and erased_by belong to a tombstone (erasure_id set)",
                              reason="INVALID_TOMBSTONE")


def _artifact_name(fleet_id: str, run_id: str, step_id: str, artifact_id: str,
                   path: str) -> str:
    """The artifact's name, from the key its origin stored it under (this fleet's layout, or
    the layout of rows stored before fleets scoped runs)."""
    for prefix in (f"fleets/{fleet_id}/runs/{run_id}/{step_id}/{artifact_id}/",
                   f"runs/{run_id}/{step_id}/"):
        if path.startswith(prefix) and len(path) > len(prefix):
            return check.artifact_name(path[len(prefix):])
    raise InvalidArgument(
        f"path {path[:200]!r} is not where this fleet keeps artifact {artifact_id} of run "
        f"{run_id}, step {step_id} (fleets/<fleet>/runs/<run>/<step>/<artifact_id>/<name>)",
        reason="INVALID_ARTIFACT_PATH")
