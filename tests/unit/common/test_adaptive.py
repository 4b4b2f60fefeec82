"""AdaptiveLimit: the limit follows latency, and callers share it fairly."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from services.common.adaptive import AdaptiveLimit
from services.common.errors import ResourceExhausted
from tests.conftest import TokenFactory

M = "/engram.shard.v1.ShardService/CreateRecord"


def _quiet(limit: AdaptiveLimit, seconds: float, calls: int = 20) -> None:
    for _ in range(calls):
        limit.leave(limit.enter("quiet", M), seconds)


def _load(limit: AdaptiveLimit, callers: int, seconds: float) -> int:
    """One round: ``callers`` agents call at once, each admitted call takes ``seconds``."""
    admitted = []
    for i in range(callers):
        with contextlib.suppress(ResourceExhausted):
            admitted.append(limit.enter(f"agent-{i}", M))
    for admission in admitted:
        limit.leave(admission, seconds)
    return len(admitted)


def test_latency_far_above_the_uncongested_shrinks_the_limit_to_its_floor() -> None:
    limit = AdaptiveLimit(64, "ENGRAM_X_ADMISSION", floor=4)
    _quiet(limit, 0.010)  # learns 10 ms uncongested
    assert limit.limit == 16  # where it starts
    for _ in range(300):
        _load(limit, 8, 0.080)  # 8x slower with 8 in flight
    assert limit.limit == 4
    assert _load(limit, 8, 0.080) == 5  # the limit, and a quarter more for callers with none


def test_the_limit_grows_back_while_it_is_used_at_normal_latency() -> None:
    limit = AdaptiveLimit(64, "ENGRAM_X_ADMISSION", floor=4)
    _quiet(limit, 0.010)
    for _ in range(300):
        _load(limit, 8, 0.080)
    assert limit.limit == 4
    for _ in range(400):
        _load(limit, limit.limit, 0.011)
    assert limit.limit >= 16
    assert limit.in_flight == 0


def test_a_method_never_seen_quiet_does_not_move_the_limit() -> None:
    limit = AdaptiveLimit(64, "ENGRAM_X_ADMISSION", floor=4)
    for _ in range(100):
        assert _load(limit, 8, 5.0) == 8
    assert limit.limit == 16


def test_a_caller_past_its_share_is_refused_and_a_quiet_one_admitted() -> None:
    limit = AdaptiveLimit(4, "ENGRAM_X_ADMISSION", floor=4)
    flood = [limit.enter("flooder", M) for _ in range(4)]  # alone: the whole limit
    with pytest.raises(ResourceExhausted) as refused:
        limit.enter("flooder", M)
    assert refused.value.reason == "OVERLOADED"
    assert refused.value.retry_delay is not None and refused.value.retry_delay > 0
    quiet = limit.enter("quiet", M)  # none in flight: admitted past the limit (a quarter)
    assert limit.in_flight == 5
    with pytest.raises(ResourceExhausted):
        limit.enter("another", M)  # 5 = ceil(4 * 1.25): the room is used up
    for admission in [*flood, quiet]:
        limit.leave(admission, 0.01)
    assert limit.in_flight == 0
    admitted = [limit.enter(who, M) for who in ("flooder", "flooder", "quiet", "quiet")]
    with pytest.raises(ResourceExhausted):
        limit.enter("flooder", M)  # two callers: a share of 2 each
    for admission in admitted:
        limit.leave(admission, 0.01)


def test_past_the_limit_only_a_caller_lighter_than_the_average_gets_in() -> None:
    now = [0.0]
    limit = AdaptiveLimit(4, "ENGRAM_X_ADMISSION", floor=4, clock=lambda: now[0])
    for _ in range(30):  # "busy" was admitted 30 times just now, "light" once
        limit.leave(limit.enter("busy", M), 0.01)
    limit.leave(limit.enter("light", M), 0.01)
    full = [limit.enter(f"holder-{i}", M) for i in range(4)]  # the limit is reached
    with pytest.raises(ResourceExhausted):
        limit.enter("busy", M)  # none in flight, but heavier than the average
    extra = limit.enter("light", M)  # none in flight and light: a quarter past the limit
    now[0] += 10.0  # ten seconds later both have decayed to nothing: equals again
    limit.leave(extra, 0.01)
    assert limit.enter("busy", M)
    for admission in full:
        limit.leave(admission, 0.01)


def test_an_unknown_admission_mode_is_refused_at_start() -> None:
    from pydantic import ValidationError

    from services.common.settings import ServerSettings

    with pytest.raises(ValidationError, match="static"):
        ServerSettings(admission="fastest")


def test_every_token_and_spelling_of_one_agent_is_one_caller(
        engram_home: Path, make_token: TokenFactory) -> None:
    """Found by review: callers were a hash of the raw header while authentication accepts the
    scheme in any case and spaces around the token, so one agent sending each call with another
    spelling took a share per spelling and shut another fleet's quiet agent out. Then they were
    a hash of the token, unverified: every token an agent minted, and every forged one, was a
    caller of its own. Now a caller is the agent a verified token names."""
    from services.common.auth import Authorizer
    from services.common.errors import Unauthenticated
    from services.common.server import token_verifier
    from services.common.settings import ServerSettings

    authorizer = Authorizer(token_verifier(ServerSettings(home=engram_home), "shard"), {})
    first, second = make_token("agent-a", "fleet-a"), make_token("agent-a", "fleet-a")
    headers = [f"Bearer {first}", f"bearer {first}", f"BEARER  {first}", f"Bearer {first}  ",
               f" Bearer {first}", f"Bearer {second}"]
    assert len({authorizer.admission_key({"authorization": h}) for h in headers}) == 1
    keys = {authorizer.admission_key({"authorization": f"Bearer {make_token(a, f)}"})
            for a, f in (("agent-a", "fleet-a"), ("agent-b", "fleet-a"), ("agent-a", "fleet-b"))}
    assert len(keys) == 3
    assert authorizer.admission_key({}) == ""
    with pytest.raises(Unauthenticated):
        authorizer.admission_key({"authorization": "Bearer forged.token.here"})


def test_the_bearer_token_is_read_the_same_way_everywhere() -> None:
    from services.common.auth import bearer_token

    assert bearer_token("bearer  tok.en ") == "tok.en"
    assert bearer_token("Basic tok.en") == "" and bearer_token("Bearer") == ""


@pytest.mark.parametrize("around", ["\x1f", "\x1c", "\x1d\x1e", "\u00a0", "\u2003"])
def test_only_spaces_and_tabs_may_surround_a_bearer_token(around: str) -> None:
    """Python's bare strip() also removed U+001C-U+001F and Unicode spaces: the service read
    'Bearer <token>\\x1f' as the token while the front proxy's caller key (signature, then
    spaces and tabs) did not match it, so one token was two callers there (found in review;
    a raw HTTP/2 client sends such bytes, grpc-python refuses to). Now the character stays
    part of the token, which then does not verify."""
    from services.common.auth import bearer_token

    assert bearer_token(f"Bearer tok.en{around}") == f"tok.en{around}"
    assert bearer_token(f"Bearer {around}tok.en") == f"{around}tok.en"
    assert bearer_token("Bearer \ttok.en \t") == "tok.en"
