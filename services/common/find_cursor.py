"""Where a text scan over a fleet's runs (FindRuns, FindIterationLogs) goes on.

Both scans walk the fleet's runs in (created, run id) order and stop at a page's end; the
next page starts at the run the last one stopped before, or, when a single run's items
filled a page, at that same run past the items already listed. The cursor travels in a
signed page token (:class:`services.common.pagination.PageTokens`) bound to the fleet, the
caller and the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, true
from sqlalchemy.orm import InstrumentedAttribute

from services.common.errors import InvalidArgument

ItemOrder = tuple[int, int, str]
"""Where an item sits in its run's scan: (0, seq, "") for an event, (1, created, id) for a
snapshot; items erased between two pages do not move the others."""


@dataclass(frozen=True)
class FindCursor:
    created_us: int
    run_id: str
    after_item: ItemOrder | None = None
    """The last of this run's items the previous page listed (None: the run not listed)."""

    def key(self) -> list[Any]:
        return [self.created_us, self.run_id,
                list(self.after_item) if self.after_item is not None else None]

    @classmethod
    def from_key(cls, key: list[Any] | None) -> FindCursor | None:
        if key is None:
            return None
        if not (len(key) == 3 and isinstance(key[0], int) and isinstance(key[1], str)
                and (key[2] is None or _is_order(key[2]))):
            raise InvalidArgument("the page token does not name a place in a run scan",
                                  reason="INVALID_PAGE_TOKEN")
        return cls(key[0], key[1], tuple(key[2]) if key[2] is not None else None)

    def listed_in(self, run_id: str) -> ItemOrder | None:
        """The last of ``run_id``'s items the previous page listed (None: none of them)."""
        return self.after_item if run_id == self.run_id else None


def _is_order(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 3 and isinstance(value[0], int)
            and isinstance(value[1], int) and isinstance(value[2], str))


def runs_from(created: InstrumentedAttribute[int], run_id: InstrumentedAttribute[str],
              cursor: FindCursor | None) -> ColumnElement[bool]:
    """The runs at or after ``cursor`` in (created, run id) order (all runs without one)."""
    if cursor is None:
        return true()
    return or_(created > cursor.created_us,
               and_(created == cursor.created_us, run_id >= cursor.run_id))


def scan_filters(scan: str, fleet_id: str, match: str) -> dict[str, Any]:
    """What a scan's page token is bound to: the scan, the fleet and the text."""
    return {"scan": scan, "fleet": fleet_id, "match": match}
