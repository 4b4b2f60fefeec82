"""The guards around erasure work: when a call purges the store, and how many whole-fleet
text scans run at once (docs/erasure.md, docs/security.md)."""

from __future__ import annotations

import threading

import pytest

from services.common.erasure_source import PurgeThrottle, TextScans, still_wanted
from services.common.errors import Aborted, ResourceExhausted, Unavailable


def test_a_purge_follows_every_erasure_and_otherwise_at_most_once_an_interval() -> None:
    # A governor repeating an erasure id that erases nothing made every call purge the whole
    # store (FTS optimize under SQLite's write lock, Postgres VACUUM of shared tables).
    now = [100.0]
    purges: list[float] = []
    throttle = PurgeThrottle(interval_s=60, clock=lambda: now[0])

    def purge() -> None:
        purges.append(now[0])

    assert throttle.purge(purge)  # the first call finishes one interrupted before a restart
    assert not throttle.purge(purge)
    throttle.owe()
    assert throttle.purge(purge)
    now[0] += 59
    assert not throttle.purge(purge)
    now[0] += 61
    assert throttle.purge(purge)
    assert [throttle.purge(purge) for _ in range(100)] == [False] * 100
    assert len(purges) == 3


def test_a_purge_that_failed_is_owed_until_one_succeeds() -> None:
    # Found by review: the purge after an erasure failed (WAL_BUSY, "run the erasure again to
    # finish it"), but the throttle had counted it; the rerun erased nothing new, skipped the
    # purge and answered OK with the erased payload still in the WAL.
    now = [100.0]
    throttle = PurgeThrottle(interval_s=60, clock=lambda: now[0])
    assert throttle.purge(lambda: None)  # the first purge, settled
    throttle.owe()  # an erasure committed

    def busy() -> None:
        raise Unavailable("the WAL could not be emptied", reason="WAL_BUSY")

    for _ in range(3):  # each rerun within the interval purges again, and fails again
        now[0] += 1
        with pytest.raises(Unavailable):
            throttle.purge(busy)
    ran: list[bool] = []
    assert throttle.purge(lambda: ran.append(True))  # the reader let go: the purge runs
    assert ran == [True]
    assert not throttle.purge(lambda: ran.append(True))  # settled: the interval again
    throttle.owe()  # erased, and the purge was never reached (a later item refused)
    assert throttle.purge(lambda: ran.append(True))
    assert ran == [True, True]


def test_only_a_purge_begun_after_a_commit_settles_it() -> None:
    # A purge that began before another call's commit may not cover it: that call's purge
    # (here failing) stays owed even though the earlier one succeeded afterwards.
    throttle = PurgeThrottle(interval_s=60, clock=lambda: 0.0)
    throttle.purge(lambda: None)

    def racing() -> None:
        throttle.owe()  # another call commits while this purge runs

    throttle.owe()
    assert throttle.purge(racing)
    assert throttle.purge(lambda: None)  # the racing commit is still owed
    assert not throttle.purge(lambda: None)


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


def test_a_call_that_finds_a_purge_running_waits_for_it_and_does_not_purge_again() -> None:
    # Found by CI: the same erasure carried out twice at once; the call that erased nothing
    # purged beside the other's purge (two SQLite checkpoints at once: one answered busy).
    throttle = PurgeThrottle(interval_s=60, clock=lambda: 0.0)
    throttle.purge(lambda: None)
    throttle.owe()
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> None:
        ran.append("first")
        inside.set()
        release.wait(10)

    first = threading.Thread(target=throttle.purge, args=(slow,))
    first.start()
    assert inside.wait(10)
    second: list[bool] = []
    waiting = threading.Thread(target=lambda: second.append(
        throttle.purge(lambda: ran.append("second"))))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()  # it waits for the running purge
    release.set()
    first.join(10)
    waiting.join(10)
    assert ran == ["first"] and second == [False]
