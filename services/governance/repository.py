"""The governance store: every change happens with its witness-chain entry in one transaction.

Appends are serialised twice: a process lock (one governance process, many
threads) and ``SELECT ... FOR UPDATE`` on the single head row (replicas on
Postgres). A state change and its chain entry commit together or not at all.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete, select
from sqlalchemy.exc import IntegrityError as SqlIntegrityError
from sqlalchemy.orm import Session

from services.common.db import Database
from services.common.errors import InvalidArgument, NotFound
from services.common.group_commit import GroupCommit
from services.governance.decisions import Decision
from services.governance.gate_cache import GateCache
from services.governance.gate_store import (
    GateOutcome,
    GateRequest,
    GateTransaction,
    read_head,
    recorded_decisions,
)
from services.governance.rules import Candidate, Rule
from services.governance.tables import (
    AgentRow,
    ChainHeadRow,
    ChainRow,
    DecisionRow,
    RuleRow,
)
from services.governance.tiers import AgentTrust, TrustAccumulator, TrustTier
from services.governance.witness import (
    GENESIS,
    ChainEntry,
    Checkpoint,
    canonical,
    next_entry,
    verify_links,
)

MIGRATIONS = Path(__file__).parent / "migrations"
Clock = Callable[[], int]


def _digest(state: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(state).encode()).hexdigest()


class GovernanceRepository:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock
        self._append_lock = threading.Lock()
        self._accumulator = TrustAccumulator()
        self._cache = GateCache()
        self._gate: GroupCommit[GateRequest, GateOutcome] = GroupCommit(self._decide_group,
                                                                        max_group=128)

    def now_ms(self) -> int:
        return self._clock()

    def migrate(self) -> None:
        self._db.upgrade(MIGRATIONS)

    # -- chain plumbing -------------------------------------------------------------------

    def _lock_head(self, session: Session) -> ChainHeadRow:
        head = session.execute(
            select(ChainHeadRow).where(ChainHeadRow.id == 1).with_for_update()
        ).scalar_one()
        return head

    def _append(self, session: Session, head: ChainHeadRow, kind: str,
                payload: dict[str, Any], now_ms: int) -> int:
        entry = next_entry(Checkpoint(head.head, head.length), kind, payload)
        session.add(ChainRow(seq=entry.seq, kind=entry.kind, payload_json=entry.payload_json,
                             prev=entry.prev, link=entry.link, created_ms=now_ms))
        head.length, head.head = entry.seq + 1, entry.link
        return entry.seq

    @staticmethod
    def _trust(session: Session, fleet_id: str,
               agent_id: str) -> tuple[AgentTrust, AgentRow | None]:
        row = session.get(AgentRow, (fleet_id, agent_id))
        if row is None:
            return AgentTrust(fleet_id, agent_id), None
        return row.to_entity(), row

    @staticmethod
    def _store_trust(session: Session, row: AgentRow | None, trust: AgentTrust, seq: int) -> None:
        if row is None:
            row = AgentRow(fleet_id=trust.fleet_id, agent_id=trust.agent_id)
            session.add(row)
        row.tier, row.score, row.pinned = trust.tier.value, trust.score, trust.pinned
        row.updated_ms, row.chain_seq = trust.updated_ms, seq

    def _begin_append(self, session: Session) -> Connection:
        """Open the append transaction before its first read of the head.

        pysqlite would begin only at the first write, after the head was read; on
        SQLite the write lock is taken up front instead, so another process cannot
        commit in between (Postgres gets the same from ``FOR UPDATE``).
        """
        conn = session.connection()
        if self._db.dialect == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        return conn

    # -- the gate -----------------------------------------------------------------------

    def decide(self, fleet_id: str, agent_id: str, request_id: str,
               candidates: Sequence[Candidate], *,
               neighbours_omitted: bool = False) -> GateOutcome:
        """Judge and record; a known ``request_id`` returns the recorded decisions (replayed).

        With ``neighbours_omitted``, an agent a contradiction rule applies to gets
        ``needs_neighbours`` and nothing is recorded. Concurrent calls share one
        transaction and one fsync (group commit).
        """
        return self._gate.submit(GateRequest(fleet_id, agent_id, request_id, tuple(candidates),
                                             neighbours_omitted))

    def _decide_group(self, requests: Sequence[GateRequest]) -> list[GateOutcome]:
        try:
            return self._record_group(requests, replays=False)
        except SqlIntegrityError:
            # A request_id seen before (or recorded by another replica meanwhile): look it up.
            return self._record_group(requests, replays=True)

    def _record_group(self, requests: Sequence[GateRequest], *,
                      replays: bool) -> list[GateOutcome]:
        with self._append_lock:
            try:
                with self._db.session() as session:
                    conn = self._begin_append(session)
                    head = read_head(conn)
                    self._cache.align(head)
                    recorded = recorded_decisions(conn, requests) if replays else {}
                    group = GateTransaction(conn, self._cache, head, self._clock(),
                                            self._accumulator, recorded)
                    outcomes = [group.decide(request) for request in requests]
                    after = group.flush()
            except BaseException:
                self._cache.forget()
                raise
            self._cache.committed(after, group.agents_after)
            return outcomes

    # -- trust ----------------------------------------------------------------------------

    def trust_of(self, fleet_id: str, agent_ids: Collection[str]) -> dict[str, AgentTrust]:
        wanted = sorted(set(agent_ids))
        with self._db.session() as session:
            rows = session.scalars(select(AgentRow).where(
                AgentRow.fleet_id == fleet_id, AgentRow.agent_id.in_(wanted)))
            found = {row.agent_id: row.to_entity() for row in rows}
        return {a: found.get(a) or AgentTrust(fleet_id, a) for a in wanted}

    @contextmanager
    def _state_change(self) -> Iterator[Session]:
        """An operator change under the append lock; the gate cache rereads afterwards."""
        with self._append_lock:
            try:
                with self._db.session() as session:
                    self._begin_append(session)
                    yield session
            finally:
                self._cache.forget()

    def set_tier(self, fleet_id: str, agent_id: str, tier: TrustTier, actor: str,
                 reason: str) -> AgentTrust:
        with self._state_change() as session:
            head = self._lock_head(session)
            now_ms = self._clock()
            before, row = self._trust(session, fleet_id, agent_id)
            after = self._accumulator.operator_sets(before, tier, now_ms)
            seq = self._append(session, head, "tier.set", {
                "agent": after.state(), "actor": actor, "reason": reason,
                "from_tier": before.tier.value}, now_ms)
            self._store_trust(session, row, after, seq)
            return after

    # -- rules ----------------------------------------------------------------------------

    def create_rule(self, rule: Rule) -> tuple[Rule, bool]:
        with self._state_change() as session:
            existing = session.get(RuleRow, rule.rule_id)
            if existing is not None:
                if existing.fleet_id != rule.fleet_id:
                    raise InvalidArgument("request_id already used in another fleet",
                                          reason="REQUEST_ID_REUSED")
                return existing.to_entity(), False
            head = self._lock_head(session)
            seq = self._append(session, head, "rule.created", {"rule": rule.state()},
                               rule.created_ms)
            head.rules_version += 1
            session.add(RuleRow(
                rule_id=rule.rule_id, fleet_id=rule.fleet_id, kind=rule.kind.value,
                params_json=json.dumps(dict(rule.params), sort_keys=True),
                description=rule.description,
                tiers_json=json.dumps([t.value for t in rule.tiers]),
                created_by=rule.created_by, created_ms=rule.created_ms, chain_seq=seq))
            return rule, True

    def delete_rule(self, fleet_id: str, rule_id: str, actor: str) -> None:
        with self._state_change() as session:
            row = session.get(RuleRow, rule_id)
            if row is None or row.fleet_id != fleet_id:
                raise NotFound(f"no rule {rule_id!r} in fleet {fleet_id!r}; "
                               "see `engram gov rules list`", reason="RULE_NOT_FOUND")
            head = self._lock_head(session)
            self._append(session, head, "rule.deleted",
                         {"rule_id": rule_id, "fleet_id": fleet_id, "actor": actor},
                         self._clock())
            head.rules_version += 1
            session.execute(delete(RuleRow).where(RuleRow.rule_id == rule_id))

    def list_rules(self, fleet_id: str, after: str | None, limit: int) -> list[Rule]:
        with self._db.session() as session:
            query = select(RuleRow).where(RuleRow.fleet_id == fleet_id)
            if after is not None:
                query = query.where(RuleRow.rule_id > after)
            rows = session.scalars(query.order_by(RuleRow.rule_id).limit(limit))
            return [row.to_entity() for row in rows]

    def list_decisions(self, fleet_id: str, agent_id: str | None, before_seq: int | None,
                       limit: int) -> list[Decision]:
        with self._db.session() as session:
            query = select(DecisionRow).where(DecisionRow.fleet_id == fleet_id)
            if agent_id:
                query = query.where(DecisionRow.agent_id == agent_id)
            if before_seq is not None:
                query = query.where(DecisionRow.chain_seq < before_seq)
            rows = session.scalars(query.order_by(DecisionRow.chain_seq.desc()).limit(limit))
            return [row.to_entity() for row in rows]

    # -- verification ---------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        with self._db.session() as session:
            head = session.get(ChainHeadRow, 1)
            if head is None:
                return Checkpoint(GENESIS, 0)
            return Checkpoint(head.head, head.length)

    def link_at(self, seq: int) -> str | None:
        with self._db.session() as session:
            return session.scalar(select(ChainRow.link).where(ChainRow.seq == seq))

    def verify(self) -> tuple[Checkpoint, list[str]]:
        """Re-walk every link, then check each state row against what the chain says."""
        with self._db.session() as session:
            replay = _Replay()
            reached, problems = verify_links(replay.feed(_entries(session)))
            head = session.get(ChainHeadRow, 1)
            if head is None or (head.head, head.length) != (reached.head, reached.length):
                problems.append("the stored chain head does not match the last chain entry")
            problems.extend(replay.compare(session))
        return reached, problems


def _entries(session: Session) -> Iterator[ChainEntry]:
    rows = session.execute(
        select(ChainRow.seq, ChainRow.kind, ChainRow.payload_json, ChainRow.prev, ChainRow.link)
        .order_by(ChainRow.seq).execution_options(yield_per=2000))
    for seq, kind, payload_json, prev, link in rows:
        yield ChainEntry(seq, kind, payload_json, prev, link)


class _Replay:
    """The state the chain implies: each row's expected (chain_seq, content digest)."""

    def __init__(self) -> None:
        self.agents: dict[tuple[str, str], tuple[int, str]] = {}
        self.rules: dict[str, tuple[int, str]] = {}
        self.decisions: dict[str, tuple[int, str]] = {}

    def feed(self, entries: Iterator[ChainEntry]) -> Iterator[ChainEntry]:
        for entry in entries:
            payload = entry.payload
            agent = payload.get("agent")
            if isinstance(agent, dict):
                key = (agent["fleet_id"], agent["agent_id"])
                self.agents[key] = (entry.seq, _digest(agent))
            if entry.kind == "gate.decision":
                decision = payload["decision"]
                self.decisions[decision["decision_id"]] = (entry.seq, _digest(decision))
            elif entry.kind == "rule.created":
                self.rules[payload["rule"]["rule_id"]] = (entry.seq, _digest(payload["rule"]))
            elif entry.kind == "rule.deleted":
                self.rules.pop(payload["rule_id"], None)
            yield entry

    def compare(self, session: Session) -> list[str]:
        problems: list[str] = []
        seen_agents = {(r.fleet_id, r.agent_id): (r.chain_seq, _digest(r.to_entity().state()))
                       for r in session.scalars(select(AgentRow))}
        problems += _differences("agent", self.agents, seen_agents)
        seen_rules = {r.rule_id: (r.chain_seq, _digest(r.to_entity().state()))
                      for r in session.scalars(select(RuleRow))}
        problems += _differences("rule", self.rules, seen_rules)
        seen_decisions = {}
        for row in session.scalars(select(DecisionRow).execution_options(yield_per=2000)):
            seen_decisions[row.decision_id] = (row.chain_seq, _digest(row.to_entity().state()))
        problems += _differences("decision", self.decisions, seen_decisions)
        return problems


def _differences(kind: str, expected: dict[Any, tuple[int, str]],
                 stored: dict[Any, tuple[int, str]]) -> list[str]:
    problems = []
    for key in sorted(set(expected) | set(stored), key=str):
        want, have = expected.get(key), stored.get(key)
        if have is None:
            problems.append(f"{kind} {key} is in the chain but missing from the store")
        elif want is None:
            problems.append(f"{kind} {key} is in the store but no chain entry wrote it")
        elif want != have:
            problems.append(f"{kind} {key} differs from chain entry {want[0]} "
                            "(the row was changed outside governance)")
    return problems

