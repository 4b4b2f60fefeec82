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
from services.common.db import Database
from services.common.errors import FailedPrecondition
from services.common.settings import MAX_AUTH_LEEWAY_SECONDS
from services.common.tokens import MAX_TTL_SECONDS
from services.governance import service as governance
from services.governance.service import GovernanceService
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


def test_expired_token_revocations_extended_again_count_as_new(
        governor: GovernanceClient) -> None:
    """Found in review of the bound: revocations with an expiry already past are not counted,
    and extending each afterwards went through the path for one already listed, uncounted."""
    gone, soon = datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC) + timedelta(hours=1)
    for n in range(LIMIT + 1):
        governor.revoke_token(f"jti-{n}", gone)
    for n in range(LIMIT):
        assert governor.revoke_token(f"jti-{n}", soon).created
    _over(governor.revoke_token, f"jti-{LIMIT}", soon)


def test_an_agent_revocation_older_than_any_token_leaves_the_feed_and_the_count(
        database: Database) -> None:
    """Every token lives at most MAX_TTL_SECONDS (verifiers refuse a longer one), so a
    revocation older than that plus the leeway refuses nothing: it is no longer listed to the
    services nor counted, and a fleet that revoked its limit once can revoke again later."""
    now = [1_000_000_000_000]
    repo = GovernanceService(database, lambda: now[0])
    for n in range(LIMIT):
        repo.revoke_agent_tokens("fleet-a", f"agent-{n}", "gov", "gone")
    with pytest.raises(FailedPrecondition) as refused_now:
        repo.revoke_agent_tokens("fleet-a", "agent-new", "gov", "compromised")
    assert refused_now.value.reason == "RESTRICTION_LIMIT"
    now[0] += (MAX_TTL_SECONDS + MAX_AUTH_LEEWAY_SECONDS) * 1000  # every token they refuse: gone
    assert [a.agent_id for a in repo.access_snapshot(0).agents] == [f"agent-{n}"
                                                                     for n in range(LIMIT)]
    now[0] += 1
    assert repo.access_snapshot(0).agents == []
    repo.revoke_agent_tokens("fleet-a", "agent-new", "gov", "compromised")
    assert [a.agent_id for a in repo.access_snapshot(0).agents] == ["agent-new"]
    repo.revoke_agent_tokens("fleet-a", "agent-0", "gov", "again")  # revoked anew: listed again
    assert {a.agent_id for a in repo.access_snapshot(0).agents} == {"agent-new", "agent-0"}
    assert repo.verify()[1] == []
