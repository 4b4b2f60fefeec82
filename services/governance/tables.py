"""SQLAlchemy tables of the governance store; rows convert to domain objects with ``to_entity``.

Every state row carries ``chain_seq``: the witness-chain entry that last wrote
it, so verification can compare the row with what the chain says.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import BigInteger, Boolean, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.governance.domain.decisions import Decision
from services.governance.domain.revocation import AgentRevocation, TokenRevocation
from services.governance.domain.rules import Rule, RuleKind
from services.governance.domain.tiers import AgentTrust, TrustTier


class Base(DeclarativeBase):
    pass


class AgentRow(Base):
    __tablename__ = "agents"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tier: Mapped[str] = mapped_column(String(16))
    score: Mapped[int] = mapped_column(Integer)
    pinned: Mapped[bool] = mapped_column(Boolean)
    updated_ms: Mapped[int] = mapped_column(BigInteger)
    chain_seq: Mapped[int] = mapped_column(BigInteger)

    def to_entity(self) -> AgentTrust:
        return agent_entity(self)


class RuleRow(Base):
    __tablename__ = "rules"

    rule_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    params_json: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text)
    tiers_json: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(128))
    created_ms: Mapped[int] = mapped_column(BigInteger)
    chain_seq: Mapped[int] = mapped_column(BigInteger)

    def to_entity(self) -> Rule:
        return rule_entity(self)


class DecisionRow(Base):
    __tablename__ = "decisions"

    decision_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))
    agent_id: Mapped[str] = mapped_column(String(128))
    request_id: Mapped[str] = mapped_column(String(128))
    position: Mapped[int] = mapped_column(Integer)
    record_id: Mapped[str] = mapped_column(String(128))
    content_hash: Mapped[str] = mapped_column(String(128))
    allowed: Mapped[bool] = mapped_column(Boolean)
    rule_ids_json: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    chain_seq: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("fleet_id", "agent_id", "request_id", "position",
                         name="uq_decisions_request"),
        Index("ix_decisions_rate", "fleet_id", "agent_id", "allowed", "created_ms"),
        Index("ix_decisions_fleet_seq", "fleet_id", "chain_seq"),
        Index("ix_decisions_agent_seq", "fleet_id", "agent_id", "chain_seq"),
    )

    def to_entity(self) -> Decision:
        return decision_entity(self)


class ChainRow(Base):
    __tablename__ = "witness_chain"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(32))
    payload_json: Mapped[str] = mapped_column(Text)
    prev: Mapped[str] = mapped_column(String(64))
    link: Mapped[str] = mapped_column(String(64))
    created_ms: Mapped[int] = mapped_column(BigInteger)


class ChainHeadRow(Base):
    """One row (id 1), locked FOR UPDATE by each append so replicas serialise on it.

    ``rules_version`` goes up with every rule change, so a replica's cached rules
    are checked against the database in the same transaction that uses them.
    """

    __tablename__ = "witness_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    length: Mapped[int] = mapped_column(BigInteger)
    head: Mapped[str] = mapped_column(String(64))
    rules_version: Mapped[int] = mapped_column(BigInteger, server_default="0")


class VerifiedCheckpointRow(Base):
    """One row (id 1): the longest prefix of the chain a full verification (every link and
    the replay against the state tables) found intact. A start checks only what follows."""

    __tablename__ = "witness_verified"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    length: Mapped[int] = mapped_column(BigInteger)
    head: Mapped[str] = mapped_column(String(64))
    verified_ms: Mapped[int] = mapped_column(BigInteger)


# Row -> entity, for ORM rows and Core result rows alike (both expose columns as attributes).

def agent_entity(row: Any) -> AgentTrust:
    return AgentTrust(row.fleet_id, row.agent_id, TrustTier(row.tier), row.score,
                      bool(row.pinned), row.updated_ms)


def rule_entity(row: Any) -> Rule:
    return Rule(
        rule_id=row.rule_id, fleet_id=row.fleet_id, kind=RuleKind(row.kind),
        params=json.loads(row.params_json), description=row.description,
        tiers=tuple(TrustTier(t) for t in json.loads(row.tiers_json)),
        created_by=row.created_by, created_ms=row.created_ms,
    )


def decision_entity(row: Any) -> Decision:
    return Decision(
        decision_id=row.decision_id, fleet_id=row.fleet_id, agent_id=row.agent_id,
        request_id=row.request_id, position=row.position, record_id=row.record_id,
        content_hash=row.content_hash, allowed=bool(row.allowed),
        rule_ids=tuple(json.loads(row.rule_ids_json)), reason=row.reason,
        created_ms=row.created_ms, chain_seq=row.chain_seq,
    )


class RevokedTokenRow(Base):
    __tablename__ = "revoked_tokens"

    jti: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Its fleet's: one fleet's revocation of a jti leaves another fleet's token alone (0006)
    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(128))
    expires_ms: Mapped[int] = mapped_column(BigInteger, index=True)
    revoked_ms: Mapped[int] = mapped_column(BigInteger)
    revoked_by: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    chain_seq: Mapped[int] = mapped_column(BigInteger)

    def to_entity(self) -> TokenRevocation:
        return TokenRevocation(self.jti, self.fleet_id, self.agent_id, self.expires_ms,
                               self.revoked_ms, self.revoked_by, self.reason)


class RevokedAgentRow(Base):
    __tablename__ = "revoked_agents"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    revoked_ms: Mapped[int] = mapped_column(BigInteger)
    revoked_by: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    chain_seq: Mapped[int] = mapped_column(BigInteger)

    def to_entity(self) -> AgentRevocation:
        return AgentRevocation(self.fleet_id, self.agent_id, self.revoked_ms, self.revoked_by,
                               self.reason)


class AccessHeadRow(Base):
    """One row (id 1): the version of the access restrictions (revocations, suspensions).

    Raised by every change that could alter them (in the change's transaction), so services
    polling ``ListAccessRestrictions`` fetch the whole set only when it may have changed.
    """

    __tablename__ = "access_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger)


class ErasureRow(Base):
    """A recorded erasure (its state as the chain entry holds it)."""

    __tablename__ = "erasures"

    erasure_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))
    state_json: Mapped[str] = mapped_column(Text)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    chain_seq: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_erasures_fleet_seq", "fleet_id", "chain_seq"),)
