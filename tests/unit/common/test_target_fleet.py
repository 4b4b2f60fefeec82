"""One rule for the fleet a call acts on, shared by every service."""

import pytest

from services.common.auth import target_fleet
from services.common.errors import InvalidArgument, PermissionDenied
from services.common.tokens import Principal

AGENT = Principal("scout", "fleet-a", frozenset({"agent"}))
SERVICE = Principal("shard", "system", frozenset({"service"}))


def test_own_fleet_when_none_or_own_is_named() -> None:
    assert target_fleet(AGENT, "") == "fleet-a"
    assert target_fleet(AGENT, "fleet-a") == "fleet-a"


def test_another_fleet_is_refused_without_the_right() -> None:
    with pytest.raises(PermissionDenied) as refused:
        target_fleet(AGENT, "fleet-b")
    assert refused.value.reason == "FLEET_MISMATCH"


def test_another_fleet_is_allowed_with_the_right_and_validated() -> None:
    assert target_fleet(SERVICE, "fleet-b", cross_fleet=True) == "fleet-b"
    with pytest.raises(InvalidArgument):
        target_fleet(SERVICE, "bad fleet!", cross_fleet=True)


def test_a_caller_that_must_name_the_fleet_is_refused_an_empty_one() -> None:
    with pytest.raises(PermissionDenied) as refused:
        target_fleet(SERVICE, "", cross_fleet=True, name_required=True)
    assert refused.value.reason == "FLEET_REQUIRED"
