"""Recorded gate decisions: one per candidate, with a deterministic id."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.errors import InvalidArgument
from services.governance.domain.rules import Candidate


def decision_id(fleet_id: str, agent_id: str, request_id: str, position: int) -> str:
    """Deterministic, so a retried gate call names the same decision."""
    raw = f"{fleet_id}\x00{agent_id}\x00{request_id}\x00{position}".encode()
    return "dec_" + hashlib.sha256(raw).hexdigest()[:28]


IMPORTED_DECISION = "gate.decision.imported"
"""The chain entry of a decision another governance recorded (ImportDecisions)."""
_CONTENT_HASH = re.compile(r"[0-9a-f]{64}")


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


MAX_DECISION_RULES = 64
"""Rules one imported decision may name (a denial names the rules that refused it)."""
SEARCH_BUDGET = 20_000
"""Position derivations one import call may try (about 20 ms of CPU in the process that
gates every fleet's writes)."""


class PositionSearch:
    """Checks imported decisions' ids, within a budget of derivations for the whole call."""

    def __init__(self, max_position: int, budget: int = SEARCH_BUDGET) -> None:
        self.max_position = max_position
        self.budget = budget

    def checked(self, decision: Decision) -> Decision:
        """``decision`` as another governance recorded it, when its id derives from its
        fleet, author, request and position (a bundle from before positions were carried:
        the position that gives its id, searched within the call's budget); raises
        ``InvalidArgument`` naming what does not hold."""
        if not _CONTENT_HASH.fullmatch(decision.content_hash):
            raise InvalidArgument(f"decision {decision.decision_id[:80]!r}: content_hash must "
                                  "be a SHA-256 (64 lowercase hex characters)",
                                  reason="INVALID_DECISION")
        if decision.created_ms <= 0:
            raise InvalidArgument(f"decision {decision.decision_id[:80]!r} has no create_time",
                                  reason="INVALID_DECISION")
        if decision.allowed == bool(decision.rule_ids):
            raise InvalidArgument(f"decision {decision.decision_id[:80]!r}: an allowed "
                                  "decision names no rule and a denial names at least one",
                                  reason="INVALID_DECISION")
        key = (decision.fleet_id, decision.agent_id, decision.request_id)
        for position in [decision.position, *range(self.max_position)]:
            if self.budget <= 0:
                raise InvalidArgument(
                    "too many decisions in this call carry no position; export them again "
                    "with a current engram (it writes each decision's position)",
                    reason="DECISION_POSITION_MISSING")
            self.budget -= 1
            if position >= 0 and decision_id(*key, position) == decision.decision_id:
                return Decision(**{**decision.__dict__, "position": position, "chain_seq": -1})
        raise InvalidArgument(
            f"decision {decision.decision_id[:80]!r} does not derive from its fleet, agent, "
            "request_id and position (altered?)", reason="DECISION_ID_MISMATCH",
            metadata={"decision_id": decision.decision_id[:80]})
