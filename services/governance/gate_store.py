"""The gate's write path in SQLAlchemy Core: a group of requests judged and recorded at once.

One transaction per group: the head row is read (``FOR UPDATE``), rules and
trust come from the :class:`GateCache` when the head says they are current,
then every chain entry and decision is inserted with one ``executemany`` each,
the agents and the head updated, and the group commits with one fsync. A
retried ``request_id`` is caught by the unique ``(fleet, agent, request_id,
position)`` constraint: the caller then reruns the group with ``replays=True``,
which looks the recorded decisions up first and returns them. A request sent
without neighbours, from an agent a contradiction rule applies to, is judged
to the end first and then dropped (``needs_neighbours``), recording nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, and_, bindparam, func, insert, or_, select, true, update

from services.common.errors import InvalidArgument
from services.governance.decisions import Decision, decision_id
from services.governance.gate_cache import AgentKey, GateCache, HeadState
from services.governance.rules import Candidate, Rule, Violation, judge, needs_neighbours
from services.governance.tables import (
    AgentRow,
    Base,
    ChainHeadRow,
    ChainRow,
    DecisionRow,
    RuleRow,
    agent_entity,
    decision_entity,
    rule_entity,
)
from services.governance.tiers import AgentTrust, TrustAccumulator
from services.governance.witness import Checkpoint, next_entry

_TABLES = Base.metadata.tables
_HEAD = _TABLES[ChainHeadRow.__tablename__]
_CHAIN = _TABLES[ChainRow.__tablename__]
_DECISIONS = _TABLES[DecisionRow.__tablename__]
_AGENTS = _TABLES[AgentRow.__tablename__]
_RULES = _TABLES[RuleRow.__tablename__]

_READ_HEAD = (select(_HEAD.c.length, _HEAD.c.head, _HEAD.c.rules_version)
              .where(_HEAD.c.id == 1).with_for_update())
_WRITE_HEAD = update(_HEAD).where(_HEAD.c.id == 1)
_READ_AGENT = select(_AGENTS).where(_AGENTS.c.fleet_id == bindparam("f"),
                                    _AGENTS.c.agent_id == bindparam("a"))
_READ_RULES = (select(_RULES).where(_RULES.c.fleet_id == bindparam("f"))
               .order_by(_RULES.c.created_ms, _RULES.c.rule_id))
_COUNT_ACCEPTED = select(func.count()).select_from(_DECISIONS).where(
    _DECISIONS.c.fleet_id == bindparam("f"), _DECISIONS.c.agent_id == bindparam("a"),
    _DECISIONS.c.allowed.is_(true()), _DECISIONS.c.created_ms >= bindparam("since"))
_UPDATE_AGENT = update(_AGENTS).where(
    _AGENTS.c.fleet_id == bindparam("k_fleet"), _AGENTS.c.agent_id == bindparam("k_agent")
).values(tier=bindparam("tier"), score=bindparam("score"), pinned=bindparam("pinned"),
         updated_ms=bindparam("updated_ms"), chain_seq=bindparam("chain_seq"))


@dataclass(frozen=True)
class GateRequest:
    fleet_id: str
    agent_id: str
    request_id: str
    candidates: tuple[Candidate, ...]
    neighbours_omitted: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return self.fleet_id, self.agent_id, self.request_id


@dataclass(frozen=True)
class GateOutcome:
    decisions: list[Decision]
    replayed: bool = False
    """The decisions were recorded by an earlier call."""
    needs_neighbours: bool = False
    """Nothing decided: a contradiction rule applies and the request carried no neighbours."""


def read_head(conn: Connection) -> HeadState:
    length, link, rules_version = conn.execute(_READ_HEAD).one()
    return HeadState(length, link, rules_version)


def recorded_decisions(conn: Connection, requests: Sequence[GateRequest]
                       ) -> dict[tuple[str, str, str], list[Decision]]:
    """Decisions already recorded for any of ``requests``, by request key, in position order."""
    d = _DECISIONS.c
    wanted = {r.key for r in requests}
    query = select(_DECISIONS).where(or_(*(
        and_(d.fleet_id == f, d.agent_id == a, d.request_id == q) for f, a, q in wanted)))
    found: dict[tuple[str, str, str], list[Decision]] = {}
    for row in conn.execute(query.order_by(d.position)):
        decision = decision_entity(row)
        found.setdefault((decision.fleet_id, decision.agent_id, decision.request_id),
                         []).append(decision)
    return found


def check_same_request(recorded: Sequence[Decision], candidates: Sequence[Candidate],
                       request_id: str) -> None:
    before = [(d.record_id, d.content_hash) for d in recorded]
    now = [(c.record_id, c.content_hash) for c in candidates]
    if before != now:
        raise InvalidArgument(
            f"request_id {request_id!r} was already used for different candidates; "
            "use a new request_id for a new write", reason="REQUEST_ID_REUSED")


class GateTransaction:
    """One group's judging and recording inside an open transaction (the append lock held)."""

    def __init__(self, conn: Connection, cache: GateCache, head: HeadState, now_ms: int,
                 accumulator: TrustAccumulator, recorded: dict[tuple[str, str, str],
                                                               list[Decision]]) -> None:
        self._conn = conn
        self._cache = cache
        self._head = head
        self._checkpoint = Checkpoint(head.link, head.length)
        self._now_ms = now_ms
        self._accumulator = accumulator
        self._recorded = recorded
        self._chain_rows: list[dict[str, Any]] = []
        self._decision_rows: list[dict[str, Any]] = []
        self._trust: dict[AgentKey, AgentTrust] = {}
        self._has_row: dict[AgentKey, bool] = {}
        self._agent_seq: dict[AgentKey, int] = {}
        self._accepted: dict[AgentKey, int] = {}
        self._window_counts: dict[tuple[AgentKey, int], int] = {}

    @property
    def agents_after(self) -> dict[AgentKey, AgentTrust]:
        return self._trust

    def decide(self, request: GateRequest) -> GateOutcome:
        recorded = self._recorded.get(request.key)
        if recorded:
            check_same_request(recorded, request.candidates, request.request_id)
            return GateOutcome(recorded, replayed=True)
        key = (request.fleet_id, request.agent_id)
        trust = self._trust_of(key)
        rules = self._rules_of(request.fleet_id)
        accepted = self._accepted.get(key, 0)

        def writes_within(window_s: int) -> int:
            if (key, window_s) not in self._window_counts:
                self._window_counts[(key, window_s)] = self._conn.execute(_COUNT_ACCEPTED, {
                    "f": key[0], "a": key[1], "since": self._now_ms - window_s * 1000,
                }).scalar_one()
            return self._window_counts[(key, window_s)] + accepted

        # Judge every candidate before recording any: the tier can move mid-request.
        verdicts: list[tuple[list[Violation], AgentTrust]] = []
        for candidate in request.candidates:
            if request.neighbours_omitted and needs_neighbours(trust, rules):
                return GateOutcome([], needs_neighbours=True)
            violations = judge(candidate, trust, rules, writes_within)
            if not violations:
                accepted += 1
            trust = self._accumulator.record_outcome(trust, not violations, self._now_ms)
            verdicts.append((violations, trust))
        self._accepted[key] = accepted
        decisions = []
        for position, (candidate, (violations, after)) in enumerate(
                zip(request.candidates, verdicts, strict=True)):
            allowed = not violations
            decision = Decision(
                decision_id=decision_id(*request.key, position),
                fleet_id=request.fleet_id, agent_id=request.agent_id,
                request_id=request.request_id, position=position,
                record_id=candidate.record_id, content_hash=candidate.content_hash,
                allowed=allowed, rule_ids=tuple(v.rule_id for v in violations),
                reason="; ".join(f"{v.rule_id}: {v.message}" for v in violations),
                created_ms=self._now_ms,
            )
            seq = self._append("gate.decision",
                               {"decision": decision.state(), "agent": after.state()})
            decision = replace(decision, chain_seq=seq)
            self._decision_rows.append(_decision_values(decision))
            decisions.append(decision)
            self._agent_seq[key] = seq
        self._trust[key] = trust
        self._recorded[request.key] = decisions
        return GateOutcome(decisions)

    def flush(self) -> HeadState:
        """Write everything judged so far; return the head the chain now has."""
        if not self._chain_rows:
            return self._head
        conn = self._conn
        conn.execute(insert(_CHAIN), self._chain_rows)
        conn.execute(insert(_DECISIONS), self._decision_rows)
        updates, inserts = [], []
        for key, trust in self._trust.items():
            values = {"tier": trust.tier.value, "score": trust.score, "pinned": trust.pinned,
                      "updated_ms": trust.updated_ms, "chain_seq": self._agent_seq[key]}
            if self._has_row[key]:
                updates.append({"k_fleet": key[0], "k_agent": key[1], **values})
            else:
                inserts.append({"fleet_id": key[0], "agent_id": key[1], **values})
        if updates:
            conn.execute(_UPDATE_AGENT, updates)
        if inserts:
            conn.execute(insert(_AGENTS), inserts)
        conn.execute(_WRITE_HEAD.values(length=self._checkpoint.length,
                                         head=self._checkpoint.head))
        return HeadState(self._checkpoint.length, self._checkpoint.head,
                         self._head.rules_version)

    def _append(self, kind: str, payload: dict[str, Any]) -> int:
        entry = next_entry(self._checkpoint, kind, payload)
        self._chain_rows.append({"seq": entry.seq, "kind": entry.kind,
                                 "payload_json": entry.payload_json, "prev": entry.prev,
                                 "link": entry.link, "created_ms": self._now_ms})
        self._checkpoint = Checkpoint(entry.link, entry.seq + 1)
        return entry.seq

    def _trust_of(self, key: AgentKey) -> AgentTrust:
        current = self._trust.get(key)
        if current is not None:
            return current
        known, cached = self._cache.agent(key)
        if not known:
            row = self._conn.execute(_READ_AGENT, {"f": key[0], "a": key[1]}).first()
            cached = agent_entity(row) if row is not None else None
            self._cache.remember_agent(key, cached)
        self._has_row[key] = cached is not None
        return cached or AgentTrust(*key)

    def _rules_of(self, fleet_id: str) -> tuple[Rule, ...]:
        rules = self._cache.rules(fleet_id)
        if rules is None:
            rules = tuple(rule_entity(row) for row in self._conn.execute(
                _READ_RULES, {"f": fleet_id}))
            self._cache.remember_rules(fleet_id, rules)
        return rules


def _decision_values(decision: Decision) -> dict[str, Any]:
    return {"decision_id": decision.decision_id, "fleet_id": decision.fleet_id,
            "agent_id": decision.agent_id, "request_id": decision.request_id,
            "position": decision.position, "record_id": decision.record_id,
            "content_hash": decision.content_hash, "allowed": decision.allowed,
            "rule_ids_json": json.dumps(list(decision.rule_ids)), "reason": decision.reason,
            "created_ms": decision.created_ms, "chain_seq": decision.chain_seq}
