"""When an erasure call purges the store (docs/erasure.md)."""

from __future__ import annotations

from services.common.erasure_source import PurgeThrottle


def test_a_purge_follows_every_erasure_and_otherwise_at_most_once_an_interval() -> None:
    # A governor repeating an erasure id that erases nothing made every call purge the whole
    # store (FTS optimize under SQLite's write lock, Postgres VACUUM of shared tables).
    now = [100.0]
    throttle = PurgeThrottle(interval_s=60, clock=lambda: now[0])
    assert throttle.due(erased=False)  # the first call finishes an interrupted one
    assert not throttle.due(erased=False)
    assert throttle.due(erased=True)
    now[0] += 59
    assert not throttle.due(erased=False)
    now[0] += 61
    assert throttle.due(erased=False)
    assert [throttle.due(erased=False) for _ in range(100)] == [False] * 100
