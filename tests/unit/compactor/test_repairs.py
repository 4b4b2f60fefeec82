"""RepairBackoff: a failing run waits base, 2*base, 4*base … up to the cap, then is due."""

from __future__ import annotations

import pytest

from services.compactor.domain.repairs import RepairBackoff

KEY = ("fleet", "run")


def test_waits_double_up_to_the_cap_and_a_success_forgets() -> None:
    backoff = RepairBackoff(1.0, 5.0)
    waits = [backoff.failed(KEY, "boom", now=100.0).retry_at - 100.0 for _ in range(5)]
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert not backoff.due(KEY, 104.9) and backoff.due(KEY, 105.0)
    assert backoff.due(("fleet", "other"), 0.0)
    assert (backoff.failing(), backoff.total_failures) == (1, 5)
    assert backoff.succeeded(KEY) and not backoff.succeeded(KEY)
    assert backoff.failure(KEY) is None and backoff.failing() == 0


def test_base_and_cap_must_make_sense() -> None:
    with pytest.raises(ValueError):
        RepairBackoff(0.0, 1.0)
    with pytest.raises(ValueError):
        RepairBackoff(2.0, 1.0)
