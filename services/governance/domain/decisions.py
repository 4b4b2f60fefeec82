"""Recorded gate decisions: one per candidate, with a deterministic id."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.errors import InvalidArgument
from services.governance.domain.rules import Candidate


def decision_id(fleet_id: str, agent_id: str, request_id: str, position: int) -> str:
    """Deterministic, so a retried gate call names the same decision."""
    raw = f"{fleet_id}\x00{agent_id}\x00{request_id}\x00{position}".encode()
    return "dec_" + hashlib.sha256(raw).hexdigest()[:28]


@dataclass(frozen=True)
class Decision:
    decision_id: str
    fleet_id: str
    agent_id: str
    request_id: str
    position: int
    record_id: str
    content_hash: str
    allowed: bool
    rule_ids: tuple[str, ...]
    reason: str
    created_ms: int
    chain_seq: int = -1

    def state(self) -> dict[str, object]:
        """What the witness chain records (the entry's own seq is not part of it)."""
        return {"decision_id": self.decision_id, "fleet_id": self.fleet_id,
                "agent_id": self.agent_id, "request_id": self.request_id,
                "position": self.position, "record_id": self.record_id,
                "content_hash": self.content_hash, "allowed": self.allowed,
                "rule_ids": list(self.rule_ids), "reason": self.reason,
                "created_ms": self.created_ms}


def check_same_request(recorded: Sequence[Decision], candidates: Sequence[Candidate],
                       request_id: str) -> None:
    """A replayed ``request_id`` must carry the candidates it was recorded with."""
    before = [(d.record_id, d.content_hash) for d in recorded]
    now = [(c.record_id, c.content_hash) for c in candidates]
    if before != now:
        raise InvalidArgument(
            f"request_id {request_id!r} was already used for different candidates; "
            "use a new request_id for a new write", reason="REQUEST_ID_REUSED")
