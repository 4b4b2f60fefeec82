"""GovernanceRepository: the governance store's SQL; every method takes an open session.

The service opens the transaction and holds the append lock; this module only
reads and writes rows. The gate's statements are built once, in SQLAlchemy
Core, so a whole group of decisions is written with one ``executemany`` per
table.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, insert, or_, select, true, update
from sqlalchemy.orm import Session

from services.governance.domain.decisions import Decision
from services.governance.domain.erasures import IMPORTED_ERASURE, RECORDED_ERASURE, Erasure
from services.governance.domain.revocation import AgentRevocation, TokenRevocation
from services.governance.domain.rules import Rule
from services.governance.domain.tiers import AgentTrust, TrustTier
from services.governance.domain.witness import ChainEntry, Checkpoint, HeadState
from services.governance.tables import (
    AccessHeadRow,
    AgentRow,
    Base,
    ChainHeadRow,
    ChainRow,
    DecisionRow,
    ErasureRow,
    RevokedAgentRow,
    RevokedTokenRow,
    RuleRow,
    VerifiedCheckpointRow,
    agent_entity,
    decision_entity,
    rule_entity,
)

RequestKey = tuple[str, str, str]
"""``(fleet_id, agent_id, request_id)``: one gate call."""

_TABLES = Base.metadata.tables
_HEAD = _TABLES[ChainHeadRow.__tablename__]
_CHAIN = _TABLES[ChainRow.__tablename__]
_DECISIONS = _TABLES[DecisionRow.__tablename__]
_AGENTS = _TABLES[AgentRow.__tablename__]
_RULES = _TABLES[RuleRow.__tablename__]
_ACCESS_HEAD = _TABLES[AccessHeadRow.__tablename__]
_VERIFIED = _TABLES[VerifiedCheckpointRow.__tablename__]

_READ_HEAD = select(_HEAD.c.length, _HEAD.c.head, _HEAD.c.rules_version).where(_HEAD.c.id == 1)
_LOCK_HEAD = _READ_HEAD.with_for_update()
# Built once: a statement made per call (``update(...).values(...)``, ``insert(table)``) is
# coerced and cache-keyed again on every gate decision (about 70 us each here).
_WRITE_HEAD = update(_HEAD).where(_HEAD.c.id == 1).values(
    length=bindparam("new_length"), head=bindparam("new_head"),
    rules_version=bindparam("new_rules_version"))
_INSERT_CHAIN = insert(_CHAIN)
_INSERT_DECISIONS = insert(_DECISIONS)
_INSERT_AGENTS = insert(_AGENTS)
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


class GovernanceRepository:
    def __init__(self, dialect: str) -> None:
        self._dialect = dialect

    # -- the chain ------------------------------------------------------------------------

    def begin_append(self, session: Session) -> None:
        """Open the append transaction before its first read of the head.

        pysqlite would begin only at the first write, after the head was read; on
        SQLite the write lock is taken up front instead, so another process cannot
        commit in between (Postgres gets the same from ``FOR UPDATE``).
        """
        conn = session.connection()
        if self._dialect == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    def lock_head(self, session: Session) -> HeadState:
        """The head row, locked ``FOR UPDATE`` until the transaction ends."""
        length, link, rules_version = session.execute(_LOCK_HEAD).one()
        return HeadState(length, link, rules_version)

    def head(self, session: Session) -> HeadState | None:
        row = session.execute(_READ_HEAD).first()
        return HeadState(*row) if row is not None else None

    def write_head(self, session: Session, head: HeadState) -> None:
        session.execute(_WRITE_HEAD, {"new_length": head.length, "new_head": head.link,
                                      "new_rules_version": head.rules_version})

    def append_entries(self, session: Session, entries: Sequence[ChainEntry],
                       created_ms: int) -> None:
        session.execute(_INSERT_CHAIN, [
            {"seq": e.seq, "kind": e.kind, "payload_json": e.payload_json, "prev": e.prev,
             "link": e.link, "created_ms": created_ms} for e in entries])

    def link_at(self, session: Session, seq: int) -> str | None:
        return session.scalar(select(ChainRow.link).where(ChainRow.seq == seq))

    def entries(self, session: Session, from_seq: int = 0) -> Iterator[ChainEntry]:
        """Every chain entry from ``from_seq`` on, in order, streamed."""
        rows = session.execute(
            select(ChainRow.seq, ChainRow.kind, ChainRow.payload_json, ChainRow.prev,
                   ChainRow.link).where(ChainRow.seq >= from_seq).order_by(ChainRow.seq)
            .execution_options(yield_per=2000))
        for seq, kind, payload_json, prev, link in rows:
            yield ChainEntry(seq, kind, payload_json, prev, link)

    def verified_checkpoint(self, session: Session) -> Checkpoint | None:
        row = session.execute(select(_VERIFIED.c.head, _VERIFIED.c.length)
                              .where(_VERIFIED.c.id == 1)).first()
        return Checkpoint(row.head, int(row.length)) if row is not None else None

    def save_verified_checkpoint(self, session: Session, checkpoint: Checkpoint,
                                 now_ms: int) -> None:
        session.execute(delete(_VERIFIED).where(_VERIFIED.c.id == 1))
        session.execute(insert(_VERIFIED).values(id=1, length=checkpoint.length,
                                                 head=checkpoint.head, verified_ms=now_ms))

    # -- agents ---------------------------------------------------------------------------

    def trust(self, session: Session, fleet_id: str, agent_id: str) -> AgentTrust | None:
        """The agent's stored trust; None when it has no row yet."""
        row = session.execute(_READ_AGENT, {"f": fleet_id, "a": agent_id}).first()
        return agent_entity(row) if row is not None else None

    def trusts(self, session: Session, fleet_id: str,
               agent_ids: Collection[str]) -> dict[str, AgentTrust]:
        """The stored trust of those of ``agent_ids`` that have a row."""
        rows = session.scalars(select(AgentRow).where(
            AgentRow.fleet_id == fleet_id, AgentRow.agent_id.in_(agent_ids)))
        return {row.agent_id: row.to_entity() for row in rows}

    def insert_agents(self, session: Session, agents: Sequence[tuple[AgentTrust, int]]) -> None:
        """Rows for agents seen for the first time, each with the chain entry that wrote it."""
        if agents:
            session.execute(_INSERT_AGENTS, [
                {"fleet_id": trust.fleet_id, "agent_id": trust.agent_id,
                 **_agent_values(trust, seq)} for trust, seq in agents])

    def update_agents(self, session: Session, agents: Sequence[tuple[AgentTrust, int]]) -> None:
        if agents:
            session.execute(_UPDATE_AGENT, [
                {"k_fleet": trust.fleet_id, "k_agent": trust.agent_id,
                 **_agent_values(trust, seq)} for trust, seq in agents])

    def stored_agents(self, session: Session) -> Iterator[tuple[AgentTrust, int]]:
        """Every agent with the chain entry that last wrote it."""
        for row in session.scalars(select(AgentRow)):
            yield row.to_entity(), row.chain_seq

    # -- rules ----------------------------------------------------------------------------

    def rule(self, session: Session, rule_id: str) -> Rule | None:
        row = session.get(RuleRow, rule_id)
        return row.to_entity() if row is not None else None

    def fleet_rules(self, session: Session, fleet_id: str) -> tuple[Rule, ...]:
        """The fleet's rules in the order the gate applies them."""
        return tuple(rule_entity(row) for row in session.execute(_READ_RULES, {"f": fleet_id}))

    def insert_rule(self, session: Session, rule: Rule, chain_seq: int) -> None:
        session.add(RuleRow(
            rule_id=rule.rule_id, fleet_id=rule.fleet_id, kind=rule.kind.value,
            params_json=json.dumps(dict(rule.params), sort_keys=True),
            description=rule.description,
            tiers_json=json.dumps([t.value for t in rule.tiers]),
            created_by=rule.created_by, created_ms=rule.created_ms, chain_seq=chain_seq))

    def delete_rule(self, session: Session, rule_id: str) -> None:
        session.execute(delete(RuleRow).where(RuleRow.rule_id == rule_id))

    def rules_page(self, session: Session, fleet_id: str, after: str | None,
                   limit: int) -> list[Rule]:
        query = select(RuleRow).where(RuleRow.fleet_id == fleet_id)
        if after is not None:
            query = query.where(RuleRow.rule_id > after)
        rows = session.scalars(query.order_by(RuleRow.rule_id).limit(limit))
        return [row.to_entity() for row in rows]

    def stored_rules(self, session: Session) -> Iterator[tuple[Rule, int]]:
        """Every rule with the chain entry that wrote it."""
        for row in session.scalars(select(RuleRow)):
            yield row.to_entity(), row.chain_seq

    # -- decisions ------------------------------------------------------------------------

    def accepted_since(self, session: Session, fleet_id: str, agent_id: str,
                       since_ms: int) -> int:
        """The agent's allowed writes recorded at or after ``since_ms``."""
        count: int = session.execute(_COUNT_ACCEPTED, {
            "f": fleet_id, "a": agent_id, "since": since_ms}).scalar_one()
        return count

    def insert_decisions(self, session: Session, decisions: Sequence[Decision]) -> None:
        session.execute(_INSERT_DECISIONS, [_decision_values(d) for d in decisions])

    def recorded_decisions(self, session: Session, keys: Collection[RequestKey]
                           ) -> dict[RequestKey, list[Decision]]:
        """Decisions already recorded for any of ``keys``, by request key, in position order."""
        d = _DECISIONS.c
        query = select(_DECISIONS).where(or_(*(
            and_(d.fleet_id == f, d.agent_id == a, d.request_id == q) for f, a, q in keys)))
        found: dict[RequestKey, list[Decision]] = {}
        for row in session.execute(query.order_by(d.position)):
            decision = decision_entity(row)
            found.setdefault((decision.fleet_id, decision.agent_id, decision.request_id),
                             []).append(decision)
        return found

    def decisions_page(self, session: Session, fleet_id: str, agent_id: str | None,
                       before_seq: int | None, limit: int) -> list[Decision]:
        """Newest first: the decisions of the fleet (or of one agent) below ``before_seq``."""
        query = select(DecisionRow).where(DecisionRow.fleet_id == fleet_id)
        if agent_id:
            query = query.where(DecisionRow.agent_id == agent_id)
        if before_seq is not None:
            query = query.where(DecisionRow.chain_seq < before_seq)
        rows = session.scalars(query.order_by(DecisionRow.chain_seq.desc()).limit(limit))
        return [row.to_entity() for row in rows]

    def decisions_by_id(self, session: Session, fleet_id: str,
                        decision_ids: Collection[str]) -> dict[str, Decision]:
        # By the primary key alone, the fleet checked here: with the fleet in the WHERE clause
        # SQLite's planner walked the (fleet_id, chain_seq) index, every row of the fleet per
        # call (an import of 100k decisions spent 41 s here, growing with the table).
        rows = session.scalars(select(DecisionRow).where(
            DecisionRow.decision_id.in_(list(decision_ids))))
        return {row.decision_id: row.to_entity() for row in rows if row.fleet_id == fleet_id}

    def stored_decisions(self, session: Session) -> Iterator[Decision]:
        """Every decision, streamed."""
        for row in session.scalars(select(DecisionRow).execution_options(yield_per=2000)):
            yield row.to_entity()


class AccessRepository:
    """Revocations and the access restrictions' version; every method takes an open session."""

    def version(self, session: Session) -> int:
        version: int = session.execute(
            select(_ACCESS_HEAD.c.version).where(_ACCESS_HEAD.c.id == 1)).scalar_one()
        return version

    def bump_version(self, session: Session) -> None:
        session.execute(update(_ACCESS_HEAD).where(_ACCESS_HEAD.c.id == 1).values(
            version=_ACCESS_HEAD.c.version + 1))

    def revoked_token(self, session: Session, fleet_id: str,
                      jti: str) -> TokenRevocation | None:
        row = session.scalars(select(RevokedTokenRow).where(
            RevokedTokenRow.fleet_id == fleet_id, RevokedTokenRow.jti == jti)).first()
        return row.to_entity() if row is not None else None

    def live_revoked_token_count(self, session: Session, fleet_id: str, now_ms: int) -> int:
        """The fleet's revoked tokens not expired at ``now_ms``."""
        return session.scalar(select(func.count()).select_from(RevokedTokenRow).where(
            RevokedTokenRow.fleet_id == fleet_id, RevokedTokenRow.expires_ms >= now_ms)) or 0

    def revoked_agent_since(self, session: Session, fleet_id: str, agent_id: str,
                            since_ms: int) -> AgentRevocation | None:
        """The agent's revocation if made at or after ``since_ms``."""
        row = session.get(RevokedAgentRow, (fleet_id, agent_id))
        return row.to_entity() if row is not None and row.revoked_ms >= since_ms else None

    def revoked_agent_count(self, session: Session, fleet_id: str, since_ms: int) -> int:
        """The fleet's agent revocations made at or after ``since_ms``."""
        return session.scalar(select(func.count()).select_from(RevokedAgentRow).where(
            RevokedAgentRow.fleet_id == fleet_id, RevokedAgentRow.revoked_ms >= since_ms)) or 0

    def suspended_count(self, session: Session, fleet_id: str) -> int:
        return session.scalar(select(func.count()).select_from(AgentRow).where(
            AgentRow.fleet_id == fleet_id, AgentRow.tier == TrustTier.SUSPENDED.value)) or 0

    def insert_revoked_token(self, session: Session, revocation: TokenRevocation,
                             chain_seq: int) -> None:
        session.add(RevokedTokenRow(**revocation.state(), chain_seq=chain_seq))

    def replace_revoked_token(self, session: Session, revocation: TokenRevocation,
                              chain_seq: int) -> None:
        row = session.get(RevokedTokenRow, (revocation.jti, revocation.fleet_id))
        assert row is not None, "replaced only when found"
        for name, value in revocation.state().items():
            setattr(row, name, value)
        row.chain_seq = chain_seq

    def upsert_revoked_agent(self, session: Session, revocation: AgentRevocation,
                             chain_seq: int) -> None:
        row = session.get(RevokedAgentRow, (revocation.fleet_id, revocation.agent_id))
        if row is None:
            session.add(RevokedAgentRow(**revocation.state(), chain_seq=chain_seq))
        else:
            row.revoked_ms, row.revoked_by = revocation.revoked_ms, revocation.revoked_by
            row.reason, row.chain_seq = revocation.reason, chain_seq

    def live_revoked_tokens(self, session: Session, now_ms: int) -> list[TokenRevocation]:
        """Revoked tokens not expired at ``now_ms`` (the caller allows for the leeway)."""
        rows = session.scalars(select(RevokedTokenRow).where(
            RevokedTokenRow.expires_ms >= now_ms))
        return [row.to_entity() for row in rows]

    def revoked_agents(self, session: Session, since_ms: int) -> list[AgentRevocation]:
        """Agent revocations made at or after ``since_ms`` (older ones can match no token)."""
        return [row.to_entity() for row in session.scalars(select(RevokedAgentRow).where(
            RevokedAgentRow.revoked_ms >= since_ms))]

    def suspended_agents(self, session: Session) -> list[tuple[str, str]]:
        rows = session.execute(select(AgentRow.fleet_id, AgentRow.agent_id).where(
            AgentRow.tier == TrustTier.SUSPENDED.value))
        return [(fleet, agent) for fleet, agent in rows]

    def stored_revocations(self, session: Session) -> Iterator[tuple[str, dict[str, object],
                                                                    int]]:
        """Every revocation as ``(key, state, chain_seq)``, keyed as the chain replay keys it."""
        for token in session.scalars(select(RevokedTokenRow)):
            yield (f"token {token.fleet_id}/{token.jti}", token.to_entity().state(),
                   token.chain_seq)
        for agent in session.scalars(select(RevokedAgentRow)):
            yield (f"agent {agent.fleet_id}/{agent.agent_id}", agent.to_entity().state(),
                   agent.chain_seq)


class ErasureRepository:
    """Recorded erasures; every method takes an open session."""

    def get(self, session: Session, erasure_id: str) -> Erasure | None:
        found = session.execute(select(ErasureRow, ChainRow.kind).join(
            ChainRow, ChainRow.seq == ErasureRow.chain_seq).where(
            ErasureRow.erasure_id == erasure_id)).first()
        return _erasure(*found) if found is not None else None

    def insert(self, session: Session, erasure: Erasure, chain_seq: int) -> None:
        session.add(ErasureRow(erasure_id=erasure.erasure_id, fleet_id=erasure.fleet_id,
                               state_json=json.dumps(erasure.state(), sort_keys=True),
                               created_ms=erasure.created_ms, chain_seq=chain_seq))

    def page(self, session: Session, fleet_id: str, after_seq: int | None,
             limit: int) -> list[Erasure]:
        """Oldest first: the fleet's erasures recorded after ``after_seq``."""
        query = select(ErasureRow, ChainRow.kind).join(
            ChainRow, ChainRow.seq == ErasureRow.chain_seq).where(ErasureRow.fleet_id == fleet_id)
        if after_seq is not None:
            query = query.where(ErasureRow.chain_seq > after_seq)
        rows = session.execute(query.order_by(ErasureRow.chain_seq).limit(limit))
        return [_erasure(row, kind) for row, kind in rows]

    def bytes_since(self, session: Session, fleet_id: str, since_ms: int) -> int:
        """The size of the fleet's erasures recorded here since ``since_ms`` (their stored
        state); imported ones do not count (they were recorded, and counted, elsewhere)."""
        return int(session.scalar(select(func.coalesce(func.sum(func.length(
            ErasureRow.state_json)), 0)).join(ChainRow, ChainRow.seq == ErasureRow.chain_seq)
            .where(ErasureRow.fleet_id == fleet_id, ErasureRow.created_ms >= since_ms,
                   ChainRow.kind == RECORDED_ERASURE)) or 0)

    def stored(self, session: Session) -> Iterator[tuple[str, dict[str, Any], int]]:
        """Every erasure as ``(erasure_id, state, chain_seq)``; a row whose JSON no longer
        parses is reported by its id with an empty state (the replay then disagrees)."""
        for row in session.scalars(select(ErasureRow)):
            try:
                state = json.loads(row.state_json)
            except ValueError:
                state = {}
            yield row.erasure_id, state, row.chain_seq


def _agent_values(trust: AgentTrust, chain_seq: int) -> dict[str, Any]:
    return {"tier": trust.tier.value, "score": trust.score, "pinned": trust.pinned,
            "updated_ms": trust.updated_ms, "chain_seq": chain_seq}


def _decision_values(decision: Decision) -> dict[str, Any]:
    return {"decision_id": decision.decision_id, "fleet_id": decision.fleet_id,
            "agent_id": decision.agent_id, "request_id": decision.request_id,
            "position": decision.position, "record_id": decision.record_id,
            "content_hash": decision.content_hash, "allowed": decision.allowed,
            "rule_ids_json": json.dumps(list(decision.rule_ids)), "reason": decision.reason,
            "created_ms": decision.created_ms, "chain_seq": decision.chain_seq}


def _erasure(row: ErasureRow, kind: str) -> Erasure:
    stored = Erasure.from_state(json.loads(row.state_json), row.chain_seq)
    return replace(stored, imported=kind == IMPORTED_ERASURE)
