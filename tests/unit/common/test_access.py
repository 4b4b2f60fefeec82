"""AccessRestrictions: what a service refuses, and what it does when governance is away."""

from __future__ import annotations

import pytest

from services.common.access import AccessRestrictions, Restrictions
from services.common.errors import PermissionDenied, Unauthenticated, Unavailable
from services.common.tokens import Principal


class Source:
    def __init__(self) -> None:
        self.current: Restrictions | None = None
        self.down = False
        self.asked: list[int] = []

    def __call__(self, since: int) -> Restrictions | None:
        self.asked.append(since)
        if self.down:
            raise RuntimeError("governance is unreachable")
        if self.current is None or self.current.version == since:
            return None
        return self.current


def _agent(agent: str = "a1", jti: str = "j1", iat: int = 100) -> Principal:
    return Principal(agent, "f1", frozenset({"agent"}), token_id=jti, issued_at=iat,
                     expires_at=iat + 3600)


def test_cold_start_with_governance_down_refuses_until_the_first_set_arrives() -> None:
    source = Source()
    source.down = True
    restrictions = AccessRestrictions(source, refresh_seconds=60)
    assert not restrictions.refresh()
    with pytest.raises(Unavailable) as caught:
        restrictions.check(_agent(), "/svc/Read")
    assert caught.value.reason == "ACCESS_RESTRICTIONS_UNKNOWN"
    source.down = False
    source.current = Restrictions(version=1)
    assert restrictions.refresh()
    restrictions.check(_agent(), "/svc/Read")


def test_refusals_and_the_last_known_set_while_governance_is_down() -> None:
    source = Source()
    source.current = Restrictions(version=3, revoked_tokens={("f1", "j-bad"): 9_999},
                                  revoked_agents={("f1", "a2"): 200},
                                  suspended=frozenset({("f1", "a3")}))
    restrictions = AccessRestrictions(source, refresh_seconds=60,
                                      suspended_may_call=frozenset({"/gov/GetTrust"}))
    restrictions.refresh()
    restrictions.check(_agent(), "/svc/Read")
    with pytest.raises(Unauthenticated) as revoked:
        restrictions.check(_agent(jti="j-bad"), "/svc/Read")
    assert revoked.value.reason == "TOKEN_REVOKED"
    # the revocation is fleet f1's: a token of another fleet under the same jti is not refused
    restrictions.check(Principal("a1", "f2", frozenset({"agent"}), token_id="j-bad"), "/svc/Read")
    for iat in (150, 200):
        with pytest.raises(Unauthenticated):
            restrictions.check(_agent("a2", iat=iat), "/svc/Read")
    restrictions.check(_agent("a2", iat=201), "/svc/Read")  # minted after the cut-off
    with pytest.raises(PermissionDenied) as suspended:
        restrictions.check(_agent("a3"), "/svc/Read")
    assert suspended.value.reason == "AGENT_SUSPENDED"
    restrictions.check(_agent("a3"), "/gov/GetTrust")
    assert restrictions.is_suspended(_agent("a3")) and not restrictions.is_suspended(_agent())

    source.down = True
    assert not restrictions.refresh()
    with pytest.raises(PermissionDenied):
        restrictions.check(_agent("a3"), "/svc/Read")  # the last known set stays in force
    source.down = False
    source.current = Restrictions(version=4)
    assert restrictions.refresh() and restrictions.version == 4
    restrictions.check(_agent("a3"), "/svc/Read")
    assert restrictions.refresh() and source.asked[-1] == 4  # asks only for what is newer
