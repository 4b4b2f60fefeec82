"""Erasures (engram forget; docs/erasure.md): governance chains what is to be erased, by whom
and why, before any service deletes anything; the services erase exactly the items listed."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.erasure_source import MAX_ERASURE_ITEMS
from services.common.errors import InvalidArgument
from services.common.limits import check_limit
from services.common.tokens import is_identifier, validate_identifier

SELECTOR_KINDS = ("agent", "record", "run", "match")
ITEM_KINDS = ("record", "summary", "run", "iterations", "event", "snapshot", "manifest",
              "evidence", "iteration")
"""``event``: one event of a kept run, id ``<run_id>:<seq>``, leaf its hash; ``snapshot``: one
snapshot, leaf its state_hash (both erased in place by the artifacts service); ``iteration``:
one iteration of a kept log, id ``<run_id>:<n>``, leaf its warm line's hash (erased in place
by the compactor); ``manifest``:
a manifest built for no run, leaf its content_hash; ``evidence``: evidence citing no
artifact, leaf 64 zeros (both deleted by the artifacts service)."""
MAX_REASON_CHARS = 1000
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ERASURE_ID = re.compile(r"era_[0-9a-f]{28}")
RECORDED_ERASURE = "erasure.recorded"
IMPORTED_ERASURE = "erasure.imported"
"""The chain entry of an erasure another governance recorded (ImportErasures)."""


@dataclass(frozen=True)
class ErasedItem:
    kind: str
    id: str
    leaf_hash: str


@dataclass(frozen=True)
class Erasure:
    erasure_id: str
    fleet_id: str
    selector_kind: str
    selector_value: str
    requested_by: str
    reason: str
    items: tuple[ErasedItem, ...]
    created_ms: int
    chain_seq: int = -1
    imported: bool = False
    """Chained as ``erasure.imported`` (not part of the chained state)."""

    def state(self) -> dict[str, object]:
        """What the witness chain records (the entry's own seq is not part of it)."""
        return {"erasure_id": self.erasure_id, "fleet_id": self.fleet_id,
                "selector_kind": self.selector_kind, "selector_value": self.selector_value,
                "requested_by": self.requested_by, "reason": self.reason,
                "items": [{"kind": i.kind, "id": i.id, "leaf_hash": i.leaf_hash}
                          for i in self.items],
                "created_ms": self.created_ms}

    @staticmethod
    def from_state(state: dict[str, object], chain_seq: int) -> Erasure:
        items = state["items"]
        assert isinstance(items, list)
        return Erasure(
            erasure_id=str(state["erasure_id"]), fleet_id=str(state["fleet_id"]),
            selector_kind=str(state["selector_kind"]),
            selector_value=str(state["selector_value"]),
            requested_by=str(state["requested_by"]), reason=str(state["reason"]),
            items=tuple(ErasedItem(str(i["kind"]), str(i["id"]), str(i["leaf_hash"]))
                        for i in items),
            created_ms=int(str(state["created_ms"])), chain_seq=chain_seq)


def erasure_id_for(fleet_id: str, request_id: str) -> str:
    """From the request id when given (a retry records nothing new), else random."""
    if request_id:
        seed = f"{fleet_id}\x00{request_id}".encode()
        return "era_" + hashlib.sha256(seed).hexdigest()[:28]
    return "era_" + secrets.token_hex(14)


def check_erasure_id(erasure_id: str) -> str:
    """An erasure id as ``erasure_id_for`` makes them (INVALID_ARGUMENT otherwise)."""
    if not _ERASURE_ID.fullmatch(erasure_id):
        raise InvalidArgument(f"erasure_id {erasure_id[:80]!r} is not an erasure id "
                              "(era_ and 28 lowercase hex digits)", reason="INVALID_ERASURE_ID")
    return erasure_id


MAX_EVENT_SEQ = 2**63 - 1
"""The largest seq a store holds (SQLite's and Postgres' signed 64-bit INTEGER)."""
_SEQ = re.compile(r"[1-9][0-9]{0,18}")


def _check_run_item_id(index: int, kind: str, item_id: str) -> None:
    """``<run_id>:<n>`` (an event's seq, an iteration's number): the run id an identifier as
    every run id is (1..128 characters, so the whole id may be longer than an identifier), n
    1..2^63-1 without leading zeros."""
    run_id, _, seq = item_id.rpartition(":")
    if (not run_id or not _SEQ.fullmatch(seq) or int(seq) > MAX_EVENT_SEQ
            or not is_identifier(run_id)):
        raise InvalidArgument(f"item {index}: an {kind}'s id is <run_id>:<n> (run_id an id of "
                              f"1..128 characters, n 1..{MAX_EVENT_SEQ} without leading "
                              f"zeros), got {item_id[:80]!r}", reason="INVALID_ITEM")


def check_request(selector_kind: str, selector_value: str, reason: str,
                  items: Sequence[ErasedItem]) -> None:
    """INVALID_ARGUMENT naming what is wrong with an erasure request."""
    if selector_kind not in SELECTOR_KINDS:
        raise InvalidArgument(f"selector_kind must be one of {', '.join(SELECTOR_KINDS)}, got "
                              f"{selector_kind!r}", reason="INVALID_SELECTOR")
    if selector_kind == "match":
        if selector_value:
            raise InvalidArgument("a match erasure does not record its text (the text is what "
                                  "is being erased): leave selector_value empty",
                                  reason="INVALID_SELECTOR")
    else:
        validate_identifier("selector_value", selector_value)
    check_limit("reason", len(reason), MAX_REASON_CHARS, "a fixed limit", "characters",
                reason="INVALID_REASON")
    if not items:
        raise InvalidArgument("an erasure lists at least one item", reason="EMPTY_ERASURE")
    check_limit("an erasure", len(items), MAX_ERASURE_ITEMS, "a fixed limit; erase in rounds",
                "items", reason="ERASURE_TOO_LARGE")
    seen: set[tuple[str, str]] = set()
    for index, item in enumerate(items):
        if item.kind not in ITEM_KINDS:
            raise InvalidArgument(f"item {index}: kind must be one of {', '.join(ITEM_KINDS)}, "
                                  f"got {item.kind!r}", reason="INVALID_ITEM")
        if item.kind in ("event", "iteration"):
            _check_run_item_id(index, item.kind, item.id)
        else:
            validate_identifier(f"item {index} id", item.id)
        if not _HEX64.fullmatch(item.leaf_hash):
            raise InvalidArgument(f"item {index}: leaf_hash must be 64 lowercase hex digits",
                                  reason="INVALID_ITEM")
        if (item.kind, item.id) in seen:
            raise InvalidArgument(f"item {index}: {item.kind} {item.id} is listed twice",
                                  reason="INVALID_ITEM")
        seen.add((item.kind, item.id))
