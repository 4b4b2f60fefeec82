"""SeqCursor: late commits below the cursor are picked up; dead gaps are forgotten."""

from __future__ import annotations

from services.shard.search.cursor import SeqCursor


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_in_order_reads_leave_no_gaps() -> None:
    cursor = SeqCursor()
    cursor.advance([1, 2, 3])
    cursor.advance([4])
    assert cursor.position == 4
    assert cursor.gaps() == []


def test_a_late_commit_below_the_cursor_is_asked_for_until_it_arrives() -> None:
    cursor = SeqCursor()
    cursor.advance([1, 2, 4, 5])  # 3 is still in flight (committed after 4 and 5)
    assert cursor.position == 5
    assert cursor.gaps() == [3]
    cursor.advance([3, 6])  # the re-read returns it, with a new row
    assert cursor.gaps() == []
    assert cursor.position == 6


def test_unsorted_input_is_handled() -> None:
    cursor = SeqCursor()
    cursor.advance([5, 1, 3])
    assert cursor.gaps() == [2, 4]


def test_gaps_that_never_fill_expire() -> None:
    clock = _Clock()
    cursor = SeqCursor(gap_ttl_s=10.0, clock=clock)
    cursor.advance([1, 3])
    clock.now = 9.0
    assert cursor.gaps() == [2]
    clock.now = 11.0  # a rolled-back transaction: give up on it
    assert cursor.gaps() == []


def test_only_the_newest_gaps_are_kept() -> None:
    cursor = SeqCursor(max_gaps=3)
    cursor.advance([1, 1000])  # rows 2..999 deleted long ago, or one huge rollback
    assert cursor.gaps() == [997, 998, 999]
    cursor.advance([1002])
    assert cursor.gaps() == [998, 999, 1001]
