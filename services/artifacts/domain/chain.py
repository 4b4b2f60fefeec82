"""The per-run event hash chain and the content-derived ids.

``hash = SHA-256(canonical JSON of prev_hash, run, seq, type, payload, manifest,
artifacts, author, time)``: altering, removing or reordering any stored event
breaks every link after it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable

from services.artifacts.domain.entities import Event, EventDraft, Run
from services.common.canonical import canonical_json
from services.common.errors import IntegrityError

GENESIS = ""


def event_hash(*, prev_hash: str, run_id: str, seq: int, type: str, payload_json: str,
               manifest_id: str, artifact_ids: tuple[str, ...], agent_id: str,
               created_us: int) -> str:
    body = canonical_json({
        "prev": prev_hash, "run": run_id, "seq": seq, "type": type, "payload": payload_json,
        "manifest": manifest_id, "artifacts": list(artifact_ids), "agent": agent_id,
        "ts": created_us,
    })
    return hashlib.sha256(body.encode()).hexdigest()


def next_event(run: Run, draft: EventDraft, created_us: int) -> Event:
    """The event that extends ``run``'s chain by one link."""
    seq = run.event_count + 1
    digest = event_hash(prev_hash=run.head_hash, run_id=run.run_id, seq=seq, type=draft.type,
                        payload_json=draft.payload_json, manifest_id=draft.manifest_id,
                        artifact_ids=draft.artifact_ids, agent_id=draft.agent_id,
                        created_us=created_us)
    return Event(run_id=run.run_id, seq=seq, type=draft.type, payload_json=draft.payload_json,
                 manifest_id=draft.manifest_id, artifact_ids=draft.artifact_ids,
                 created_us=created_us, agent_id=draft.agent_id, prev_hash=run.head_hash,
                 hash=digest)


def expected_hash(event: Event, prev_hash: str) -> str:
    return event_hash(prev_hash=prev_hash, run_id=event.run_id, seq=event.seq, type=event.type,
                      payload_json=event.payload_json, manifest_id=event.manifest_id,
                      artifact_ids=event.artifact_ids, agent_id=event.agent_id,
                      created_us=event.created_us)


class ChainVerifier:
    """Checks events fed in order from seq 1; raises IntegrityError at the first broken link."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.head = GENESIS
        self.length = 0

    def check(self, event: Event) -> Event:
        if event.seq != self.length + 1:
            raise IntegrityError(
                f"run {self.run_id}: event seq {event.seq} follows {self.length} (gap or reorder)",
                reason="EVENT_CHAIN_BROKEN", metadata={"run_id": self.run_id,
                                                       "seq": str(event.seq)})
        if event.prev_hash != self.head or expected_hash(event, self.head) != event.hash:
            raise IntegrityError(
                f"run {self.run_id}: event {event.seq} does not match its hash chain "
                "(altered or removed events)", reason="EVENT_CHAIN_BROKEN",
                metadata={"run_id": self.run_id, "seq": str(event.seq)})
        self.head = event.hash
        self.length = event.seq
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
    return "mf_" + sha256_text(content_json)[:40]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
