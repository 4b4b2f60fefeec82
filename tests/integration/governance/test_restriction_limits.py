"""A fleet's access restrictions are bounded, and the feed every service reads carries keys
only. Every fleet's revocations and suspensions go to every service in one
ListAccessRestrictions reply: a governor revoking made-up ids (with 4,000-byte reasons) grew it
past the 64 MiB message limit in about 16,000 calls, and from then on no service took any
fleet's new revocation or suspension (found in review, 2026-11-30)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.governance import service as governance
from tests.integration.governance.conftest import GovClientFactory, refused

LIMIT = 3


@pytest.fixture(autouse=True)
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MAX_LIVE_REVOKED_TOKENS_PER_FLEET", "MAX_REVOKED_AGENTS_PER_FLEET",
                 "MAX_SUSPENDED_PER_FLEET"):
        monkeypatch.setattr(governance, name, LIMIT)


def _over(call: object, *args: object, **kwargs: object) -> None:
    error = refused(lambda: call(*args, **kwargs))  # type: ignore[operator]
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION,
                                          "RESTRICTION_LIMIT"), error
    assert error.metadata["limit"] == str(LIMIT)


def test_a_fleet_holds_a_bounded_number_of_live_token_revocations(
        governor: GovernanceClient, gov_for: GovClientFactory) -> None:
    soon, gone = datetime.now(UTC) + timedelta(hours=1), datetime.now(UTC) - timedelta(hours=1)
    for n in range(LIMIT):  # expired past the services' leeway: not listed, not counted
        governor.revoke_token(f"jti-expired-{n}", gone)
    for n in range(LIMIT):
        assert governor.revoke_token(f"jti-{n}", soon).created
    _over(governor.revoke_token, "jti-one-more", soon)
    # the same token again, with a later expiry, is no new entry
    assert governor.revoke_token("jti-0", soon + timedelta(hours=1)).created
    other = gov_for("gov-b", "fleet-b", ("governor",))
    assert other.revoke_token("jti-of-b", soon).created  # another fleet: its own count


def test_a_fleet_holds_a_bounded_number_of_revoked_agents_and_suspensions(
        governor: GovernanceClient, gov_for: GovClientFactory) -> None:
    for n in range(LIMIT):
        governor.revoke_agent_tokens(f"agent-{n}", reason="gone")
    _over(governor.revoke_agent_tokens, "agent-one-more")
    governor.revoke_agent_tokens("agent-0", reason="again")  # an agent revoked before: allowed

    for n in range(LIMIT):
        governor.set_tier(f"agent-{n}", "suspended")
    _over(governor.set_tier, "agent-one-more", "suspended")
    governor.set_tier("agent-0", "suspended")  # suspended already: no new entry
    governor.set_tier("agent-0", "standard")  # lifted: room for another
    governor.set_tier("agent-one-more", "suspended")
    other = gov_for("gov-b", "fleet-b", ("governor",))
    other.revoke_agent_tokens("agent-of-b")
    other.set_tier("agent-of-b", "suspended")


def test_the_restrictions_feed_carries_keys_and_times_only(
        governor: GovernanceClient, shard_service: GovernanceClient) -> None:
    soon = datetime.now(UTC) + timedelta(hours=1)
    governor.revoke_token("jti-leaked", soon, agent_id="agent-1", reason="r" * 1000)
    governor.revoke_agent_tokens("agent-2", reason="r" * 1000)
    governor.set_tier("agent-3", "suspended", reason="r" * 1000)
    feed = shard_service.access_restrictions()
    [token], [agent], [suspended] = (feed.revoked_tokens, feed.revoked_agents,
                                     feed.suspended_agents)
    assert token == pb.RevokedToken(fleet_id="fleet-a", jti="jti-leaked",
                                    expire_time=token.expire_time)
    assert token.expire_time.seconds == int(soon.timestamp())
    assert agent == pb.RevokedAgent(fleet_id="fleet-a", agent_id="agent-2",
                                    issued_before=agent.issued_before)
    assert agent.issued_before.seconds > 0
    assert suspended == pb.AgentRef(fleet_id="fleet-a", agent_id="agent-3")
