"""Token revocations governance records: one token by its ``jti``, or every token of an agent
issued up to a cut-off. Times are milliseconds since the epoch, as elsewhere in the store."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenRevocation:
    jti: str
    fleet_id: str
    agent_id: str
    expires_ms: int
    """The token's own expiry: after it the revocation no longer needs listing."""
    revoked_ms: int
    revoked_by: str
    reason: str

    def state(self) -> dict[str, object]:
        """What the witness chain records."""
        return {"jti": self.jti, "fleet_id": self.fleet_id, "agent_id": self.agent_id,
                "expires_ms": self.expires_ms, "revoked_ms": self.revoked_ms,
                "revoked_by": self.revoked_by, "reason": self.reason}


@dataclass(frozen=True)
class AgentRevocation:
    fleet_id: str
    agent_id: str
    revoked_ms: int
    """Tokens of the agent issued at or before this instant's second are refused."""
    revoked_by: str
    reason: str

    @property
    def issued_before_s(self) -> int:
        return self.revoked_ms // 1000

    def state(self) -> dict[str, object]:
        return {"fleet_id": self.fleet_id, "agent_id": self.agent_id,
                "revoked_ms": self.revoked_ms, "revoked_by": self.revoked_by,
                "reason": self.reason}


@dataclass(frozen=True)
class AccessSnapshot:
    """Everything every service refuses, at one version of the access restrictions."""

    version: int
    tokens: list[TokenRevocation]
    """Revoked tokens not expired yet."""
    agents: list[AgentRevocation]
    suspended: list[tuple[str, str]]
    """``(fleet_id, agent_id)`` of every suspended agent."""
