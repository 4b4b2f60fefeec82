"""A revoked token is listed to the services as long as any of them may still accept it: up to
the largest leeway a service may have past the token's own expiry (found by review on
2026-11-30: dropped at its exp, the revocation was gone from the list a restarted service read,
which then accepted the token again for its 30 s of leeway). SQLite and Postgres."""

from __future__ import annotations

from services.common.db import Database
from services.common.settings import MAX_AUTH_LEEWAY_SECONDS
from services.governance.domain.revocation import TokenRevocation
from services.governance.service import GovernanceService


class _Clock:
    ms = 1_000_000_000

    def __call__(self) -> int:
        return self.ms


def test_a_revocation_is_listed_until_the_largest_leeway_after_the_tokens_expiry(
        database: Database) -> None:
    clock = _Clock()
    service = GovernanceService(database, clock)
    expires_ms = clock.ms + 60_000
    service.revoke_token(TokenRevocation("jti-1", "fleet-a", "agent-1", expires_ms, clock.ms,
                                         "admin", "stolen"))

    def listed() -> set[str]:
        snapshot = service.access_snapshot(-1)
        assert snapshot is not None
        return {t.jti for t in snapshot.tokens}

    assert listed() == {"jti-1"}
    clock.ms = expires_ms + 10_000  # past exp, inside a service's leeway: still refused
    assert listed() == {"jti-1"}
    clock.ms = expires_ms + MAX_AUTH_LEEWAY_SECONDS * 1000 + 1  # no service accepts it now
    assert listed() == set()
