"""The erasure lookup both verifications share (services/common/tombstone_audit.py): each
erasure id is asked about once while cached, the cache holds at most ``max_items`` items (the
least recently used erasures are let go and asked again when named again), another fleet's
erasure or one governance has not lists nothing, and after governance failed to answer nothing
more is asked."""

from __future__ import annotations

import logging

from services.common.erasure_source import ErasureOrder
from services.common.errors import NotFound, Unavailable
from services.common.tombstone_audit import ErasureLookup, RecordedErasures

ERA_A, ERA_B, ERA_C, ERA_D = ("era_" + c * 28 for c in "abcd")
log = logging.getLogger("test")


def _order(erasure_id: str, fleet: str, count: int) -> ErasureOrder:
    return ErasureOrder(erasure_id, fleet, "op",
                        tuple(("record", f"{erasure_id}-{n}", "1" * 64) for n in range(count)))


class Source:
    def __init__(self, down_after: int = 99) -> None:
        self.orders = {ERA_A: _order(ERA_A, "f", 4), ERA_B: _order(ERA_B, "f", 4),
                       ERA_C: _order(ERA_C, "g", 1)}
        self.down_after = down_after
        self.asked: list[str] = []

    def erasure(self, erasure_id: str) -> ErasureOrder:
        self.asked.append(erasure_id)
        if len(self.asked) > self.down_after:
            raise Unavailable("no answer", reason="GOVERNANCE_UNAVAILABLE")
        if erasure_id not in self.orders:
            raise NotFound("none", reason="ERASURE_NOT_FOUND")
        return self.orders[erasure_id]


def test_each_erasure_is_asked_once_within_the_bound() -> None:
    source = Source()
    lookup = ErasureLookup(source, "f", log, max_items=8)
    for _ in range(3):
        assert lookup.lists(ERA_A, ("record",), f"{ERA_A}-1", "1" * 64) is True
        assert lookup.lists(ERA_B, ("record", "summary"), f"{ERA_B}-0", "1" * 64) is True
        assert lookup.lists(ERA_B, ("summary",), f"{ERA_B}-0", "1" * 64) is False
        assert lookup.lists(ERA_A, ("record",), f"{ERA_A}-1", "2" * 64) is False
    assert source.asked == [ERA_A, ERA_B]
    assert lookup.items(ERA_C) == frozenset()  # another fleet's: lists nothing here
    assert lookup.items(ERA_D) == frozenset()  # none such
    assert lookup.items(ERA_A) is not None  # still held: C's item let B go, used least
    assert source.asked == [ERA_A, ERA_B, ERA_C, ERA_D]


def test_past_the_bound_the_first_read_are_let_go() -> None:
    source = Source()
    lookup = ErasureLookup(source, "f", log, max_items=5)
    lookup.items(ERA_A)
    lookup.items(ERA_B)  # 8 items > 5: A is let go
    lookup.items(ERA_B)
    lookup.items(ERA_A)  # asked again; B let go
    assert source.asked == [ERA_A, ERA_B, ERA_A]


def test_after_governance_failed_nothing_more_is_asked() -> None:
    source = Source(down_after=1)
    lookup = ErasureLookup(source, "f", log)
    assert lookup.items(ERA_A) is not None
    assert lookup.lists(ERA_B, ("record",), f"{ERA_B}-0", "1" * 64) is None
    assert lookup.items(ERA_C) is None
    assert lookup.items(ERA_A) is not None  # what was read before is still known
    assert source.asked == [ERA_A, ERA_B]
    assert lookup.down.startswith("GOVERNANCE_UNAVAILABLE")
    assert ErasureLookup(None, "f", log).items(ERA_A) is None


def test_erasures_governance_answered_are_not_asked_again_by_later_calls() -> None:
    # Found by review: any agent paging VerifyRecords again and again made the shard ask
    # governance once per erasure id on every page (the cache lived for one call).
    source = Source()
    recorded = RecordedErasures(max_items=6)
    for _ in range(3):
        lookup = ErasureLookup(source, "f", log, recorded=recorded)  # type: ignore[arg-type]
        assert lookup.lists(ERA_A, ("record",), f"{ERA_A}-1", "1" * 64)
        assert lookup.items(ERA_C) == frozenset()  # another fleet's lists nothing here
        assert lookup.items(ERA_D) == frozenset()  # not recorded: asked each call
    assert source.asked == [ERA_A, ERA_C, ERA_D, ERA_D, ERA_D]
    ErasureLookup(source, "f", log, recorded=recorded).items(ERA_B)  # 4 more: A is let go
    ErasureLookup(source, "f", log, recorded=recorded).items(ERA_A)
    assert source.asked[-2:] == [ERA_B, ERA_A]
