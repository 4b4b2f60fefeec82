"""The witness chain: every governance state change and gate decision, linked by SHAKE-256.

``link[n] = SHAKE-256(link[n-1] || seq || kind || 0x00 || payload)`` with a
32-byte output; the first entry links to 32 zero bytes. The payload is
canonical JSON (sorted keys, no spaces), so any edit to a stored entry, a
dropped entry or a reordering breaks every later link. A checkpoint is
``(head, length)``; a later chain extends it when its entry ``length - 1``
still carries ``head``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from services.common.canonical import canonical_json

LINK_BYTES = 32
GENESIS = "00" * LINK_BYTES


def link(prev: str, seq: int, kind: str, payload_json: str) -> str:
    shake = hashlib.shake_256()
    shake.update(bytes.fromhex(prev))
    shake.update(seq.to_bytes(8, "big"))
    shake.update(kind.encode() + b"\x00")
    shake.update(payload_json.encode())
    return shake.hexdigest(LINK_BYTES)


@dataclass(frozen=True)
class ChainEntry:
    seq: int
    kind: str
    payload_json: str
    prev: str
    link: str

    @property
    def payload(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.payload_json)
        return loaded


@dataclass(frozen=True)
class Checkpoint:
    head: str
    length: int


@dataclass(frozen=True)
class HeadState:
    """The stored head: the chain's ``(length, link)`` and the version every rule change raises."""

    length: int
    link: str
    rules_version: int

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.link, self.length)


def next_entry(head: Checkpoint, kind: str, payload: Mapping[str, Any]) -> ChainEntry:
    body = canonical_json(payload)
    return ChainEntry(head.length, kind, body, head.head, link(head.head, head.length, kind, body))


class NewEntries:
    """Entries appended after a checkpoint and not stored yet; ``reached`` is where they lead."""

    def __init__(self, start: Checkpoint) -> None:
        self.entries: list[ChainEntry] = []
        self.reached = start

    def add(self, kind: str, payload: Mapping[str, Any]) -> int:
        """Append one entry; return its seq."""
        entry = next_entry(self.reached, kind, payload)
        self.entries.append(entry)
        self.reached = Checkpoint(entry.link, entry.seq + 1)
        return entry.seq


def verify_links(entries: Iterable[ChainEntry], start: Checkpoint = Checkpoint(GENESIS, 0)
                 ) -> tuple[Checkpoint, list[str]]:
    """Walk the entries in order from ``start`` (the genesis by default); return the
    checkpoint they reach and every broken link."""
    problems: list[str] = []
    prev, expected_seq = start.head, start.length
    for entry in entries:
        if entry.seq != expected_seq:
            problems.append(f"entry {expected_seq} is missing (next stored entry is {entry.seq})")
        if entry.prev != prev:
            problems.append(f"entry {entry.seq} does not point at the previous link")
        recomputed = link(prev, entry.seq, entry.kind, entry.payload_json)
        if recomputed != entry.link:
            problems.append(f"entry {entry.seq} ({entry.kind}) was altered: its link does "
                            "not match its content")
        # A stored link that is not hex would crash the next link(); walk on from the recomputed.
        prev = entry.link if _is_link(entry.link) else recomputed
        expected_seq = entry.seq + 1
    return Checkpoint(prev, expected_seq), problems


def _is_link(value: str) -> bool:
    try:
        return len(bytes.fromhex(value)) == LINK_BYTES
    except ValueError:
        return False


def extends(earlier: Checkpoint, link_at: str | None) -> bool:
    """Whether a chain whose entry ``earlier.length - 1`` has ``link_at`` extends ``earlier``."""
    if earlier.length == 0:
        return earlier.head == GENESIS
    return link_at == earlier.head
