"""The per-run event hash chain, snapshot state commitments and the content-derived ids.

``hash = SHA-256(canonical JSON of prev_hash, run, seq, type, payload, manifest,
artifacts, author, time)``: altering, removing or reordering any stored event
breaks every link after it. Format 2 (every event appended now) chains the payload's salted
commitment (``services.common.commitment``) in the payload's place, so once an erasure
deleted the payload and its salt, no hash it left confirms a guess of the payload; format-1
events (stored before) keep their hashes and verify as they always did.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import replace

from services.artifacts.domain.entities import (
    Event,
    EventDraft,
    Manifest,
    ManifestProblem,
    Run,
    Snapshot,
)
from services.common.canonical import canonical_json
from services.common.commitment import commitment, commits_to, is_salt, new_salt
from services.common.erasure_source import is_erasure_id
from services.common.errors import IntegrityError

GENESIS = ""
FORMAT = 2
"""The format of events and snapshots made now (1: plain hashes of the content; 2: salted
commitments to it, docs/erasure.md)."""
FORMATS = (1, 2)
EMPTY_RUN_LEAF = "0" * 64
"""The leaf an erasure lists for a run with no events yet (its head hash is empty): such a run
still holds its metadata, manifests and artifacts."""


def run_leaf(head_hash: str) -> str:
    """The leaf hash an erasure of a run with this head lists (:data:`EMPTY_RUN_LEAF` if none)."""
    return head_hash or EMPTY_RUN_LEAF
_HEX64 = re.compile(r"[0-9a-f]{64}")


def event_hash(*, prev_hash: str, run_id: str, seq: int, type: str, payload_json: str,
               manifest_id: str, artifact_ids: tuple[str, ...], agent_id: str,
               created_us: int) -> str:
    body = canonical_json({
        "prev": prev_hash, "run": run_id, "seq": seq, "type": type, "payload": payload_json,
        "manifest": manifest_id, "artifacts": list(artifact_ids), "agent": agent_id,
        "ts": created_us,
    })
    return hashlib.sha256(body.encode()).hexdigest()


def event_hash_v2(*, prev_hash: str, run_id: str, seq: int, type: str,
                  payload_commitment: str, manifest_id: str, artifact_ids: tuple[str, ...],
                  agent_id: str, created_us: int) -> str:
    """Format 2: the payload enters only through its salted commitment."""
    body = canonical_json({
        "v": 2, "prev": prev_hash, "run": run_id, "seq": seq, "type": type,
        "payload_commitment": payload_commitment, "manifest": manifest_id,
        "artifacts": list(artifact_ids), "agent": agent_id, "ts": created_us,
    })
    return hashlib.sha256(body.encode()).hexdigest()


def payload_commitment(salt: str, payload_json: str) -> str:
    return commitment(salt, payload_json.encode())


def state_commitment(salt: str, state_json: str) -> str:
    return commitment(salt, state_json.encode())


def next_event(run: Run, draft: EventDraft, created_us: int) -> Event:
    """The event that extends ``run``'s chain by one link (format 2, a new salt)."""
    salt = new_salt()
    event = Event(run_id=run.run_id, seq=run.event_count + 1, type=draft.type,
                  payload_json=draft.payload_json, manifest_id=draft.manifest_id,
                  artifact_ids=draft.artifact_ids, created_us=created_us,
                  agent_id=draft.agent_id, prev_hash=run.head_hash, hash="", format=FORMAT,
                  salt=salt, payload_commitment=payload_commitment(salt, draft.payload_json))
    return replace(event, hash=expected_hash(event, run.head_hash))


def expected_hash(event: Event, prev_hash: str) -> str:
    """The hash ``event`` must have after ``prev_hash`` (format 2: over its stored commitment,
    which :func:`event_intact` checks against the payload and salt)."""
    if event.format == 2:
        return event_hash_v2(prev_hash=prev_hash, run_id=event.run_id, seq=event.seq,
                             type=event.type, payload_commitment=event.payload_commitment,
                             manifest_id=event.manifest_id, artifact_ids=event.artifact_ids,
                             agent_id=event.agent_id, created_us=event.created_us)
    return event_hash(prev_hash=prev_hash, run_id=event.run_id, seq=event.seq, type=event.type,
                      payload_json=event.payload_json, manifest_id=event.manifest_id,
                      artifact_ids=event.artifact_ids, agent_id=event.agent_id,
                      created_us=event.created_us)


def tombstone_intact(format: int, salt: str, content: str, kept_commitment: str, *,
                     erasure_id: str, erased_us: int) -> bool:
    """Whether an item erased in place is a well-formed tombstone: format 2 (a format-1 item's
    hash needs its content, so it is never erased in place), its content and salt gone, its
    commitment kept (what its link or ``state_hash`` is checked against), and it names an
    erasure id of the form governance issues and when it was erased. This is the form only:
    whether that erasure lists the item is VerifyArtifacts' audit (``tombstone_audit``)."""
    return format == 2 and not salt and not content and bool(
        _HEX64.fullmatch(kept_commitment)) and is_erasure_id(erasure_id) and erased_us > 0


def run_tombstone_intact(head_hash: str, erasure_id: str, erased_us: int) -> bool:
    """Whether a whole run's tombstone has a tombstone's form: the head hash it kept is empty
    (a run with no events) or a hash, and it names an erasure id of governance's form and when
    it was erased. Whether that erasure lists the run is VerifyArtifacts' audit."""
    return (not head_hash or bool(_HEX64.fullmatch(head_hash))) and \
        is_erasure_id(erasure_id) and erased_us > 0


def event_intact(event: Event, prev_hash: str) -> bool:
    """Whether ``event`` hashes to its hash after ``prev_hash``; format 2 also needs its
    commitment to recompute from its payload and salt (format 1 has neither). An event erased
    in place (a tombstone) recomputes its link from its stored commitment alone."""
    if event.erasure_id:
        if not tombstone_intact(event.format, event.salt, event.payload_json,
                                event.payload_commitment, erasure_id=event.erasure_id,
                                erased_us=event.erased_us):
            return False
    elif event.format == 2:
        if not commits_to(event.salt, event.payload_json.encode(), event.payload_commitment):
            return False
    elif event.format != 1 or event.salt or event.payload_commitment:
        return False
    return expected_hash(event, prev_hash) == event.hash


def new_snapshot_state(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` in format 2: a new salt, its state_hash the state's commitment."""
    salt = new_salt()
    return replace(snapshot, format=FORMAT, salt=salt,
                   state_hash=state_commitment(salt, snapshot.state_json))


def expected_state_hash(format: int, salt: str, state_json: str) -> str:
    """What a snapshot's ``state_hash`` must be: format 1 the SHA-256 of its state, format 2
    the state's commitment under its salt ("" for a malformed salt or an unknown format:
    that matches no hash)."""
    if format == 1 and not salt:
        return sha256_text(state_json)
    if format == 2:
        try:
            return state_commitment(salt, state_json)
        except ValueError:
            return ""
    return ""


class ChainVerifier:
    """Checks events fed in order (from seq 1, or from a tail's first); raises IntegrityError
    at the first broken link."""

    def __init__(self, run_id: str, head: str = GENESIS, length: int = 0) -> None:
        """From the start of the chain, or from its ``length``-th event, whose hash is
        ``head`` (a tail, as Rehydrate reads it)."""
        self.run_id = run_id
        self.head = head
        self.length = length
        self.tombstoned = 0
        """Events checked that were erased in place (their links verified, no content)."""

    def check(self, event: Event) -> Event:
        if event.seq != self.length + 1:
            raise IntegrityError(
                f"run {self.run_id}: event seq {event.seq} follows {self.length} (gap or reorder)",
                reason="EVENT_CHAIN_BROKEN", metadata={"run_id": self.run_id,
                                                       "seq": str(event.seq)})
        if event.prev_hash != self.head or not event_intact(event, self.head):
            raise IntegrityError(
                f"run {self.run_id}: event {event.seq} does not match its hash chain "
                "(altered or removed events)", reason="EVENT_CHAIN_BROKEN",
                metadata={"run_id": self.run_id, "seq": str(event.seq)})
        self.head = event.hash
        self.length = event.seq
        self.tombstoned += event.erased
        return event

    def check_all(self, events: Iterable[Event]) -> str:
        for event in events:
            self.check(event)
        return self.head


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def evidence_id(corpus_id: str, index_id: str, chunk_id: str, start: int, end: int) -> str:
    """Deterministic and namespaced by corpus/index: the same evidence always has one id."""
    body = canonical_json({"ns": f"{corpus_id}/{index_id}", "chunk": chunk_id,
                           "span": [start, end]})
    return "ev_" + hashlib.sha256(body.encode()).hexdigest()[:40]


def manifest_id(content_json: str) -> str:
    """A format-1 manifest's id: derived from its content (manifests stored before 0006)."""
    return "mf_" + sha256_text(content_json)[:40]


_MANIFEST_ID = re.compile(r"mf_[0-9a-f]{40}")


def new_manifest_id() -> str:
    """A format-2 manifest's id: random, in the same form as a format-1 one."""
    return "mf_" + secrets.token_hex(20)


def manifest_key(fleet_secret: bytes, content_json: str) -> str:
    """What finds a format-2 manifest by its content (``manifest_keys``): keyed by the fleet's
    secret, so it confirms no guess without that secret, and deleted with the manifest."""
    return hmac.new(fleet_secret, b"engram-manifest\x00" + content_json.encode(),
                    hashlib.sha256).hexdigest()


def manifest_intact(manifest: Manifest) -> bool:
    """Whether the stored manifest still matches its hash: format 1 its id and content_hash
    derived from the content, format 2 its content_hash the commitment under its salt."""
    if manifest.format == 2:
        return bool(_MANIFEST_ID.fullmatch(manifest.manifest_id)) and commits_to(
            manifest.salt, manifest.content_json.encode(), manifest.content_hash)
    return manifest.content_hash == sha256_text(manifest.content_json) and \
        manifest.manifest_id == manifest_id(manifest.content_json)


def manifest_problem(manifest: Manifest) -> ManifestProblem | None:
    """What is wrong with the stored manifest (None: it is intact); ``actual_hash`` is what
    its content gives now ("" when its salt is not one)."""
    if manifest_intact(manifest):
        return None
    actual = ""
    if manifest.format != 2:
        actual = sha256_text(manifest.content_json)
    elif is_salt(manifest.salt):
        actual = commitment(manifest.salt, manifest.content_json.encode())
    return ManifestProblem(manifest.manifest_id, manifest.run_id, "MANIFEST_HASH_MISMATCH",
                           manifest.content_hash, actual)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
