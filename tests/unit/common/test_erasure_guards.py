"""The guards around erasure work: when a call purges the store, and how many whole-fleet
text scans run at once (docs/erasure.md, docs/security.md)."""

from __future__ import annotations

import pytest

from services.common.erasure_source import PurgeThrottle, TextScans, still_wanted
from services.common.errors import Aborted, ResourceExhausted


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


def test_text_scans_beyond_the_slots_are_refused_at_once_and_slots_come_back() -> None:
    # A governor's FindRuns/FindIterationLogs/ForgetRecords-by-match each read a whole fleet:
    # without a bound, a handful of them held every worker of the replica.
    scans = TextScans(slots=2)
    with scans.slot("a"), scans.slot("b"):
        with pytest.raises(ResourceExhausted) as busy, scans.slot("c"):
            pass
        assert busy.value.reason == "SCAN_BUSY"
    with scans.slot("d"), scans.slot("e"):  # released, whatever ended the scans
        pass
    with pytest.raises(ValueError), scans.slot("f"):
        raise ValueError("a scan that failed")
    with scans.slot("g"), scans.slot("h"):
        pass


def test_a_scan_stops_when_its_caller_has_gone() -> None:
    still_wanted(lambda: True)
    with pytest.raises(Aborted) as gone:
        still_wanted(lambda: False)
    assert gone.value.reason == "SCAN_ABANDONED"
