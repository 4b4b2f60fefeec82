"""paginate(): pages in order, a token only when another row exists, tokens bound to filters."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.common.pagination import DEFAULT_PAGE_SIZE, PageTokens
from services.common.settings import LimitsSettings

MAX_PAGE_SIZE = LimitsSettings().page_size
paginate = PageTokens.ephemeral().paginate

ROWS = [(ts, f"id-{ts}") for ts in range(1, 11)]


class Table:
    """Rows sorted by (ts, id); records each fetch's arguments."""

    def __init__(self, rows: list[tuple[int, str]]) -> None:
        self.rows = rows
        self.fetches: list[tuple[list[Any] | None, int]] = []

    def fetch(self, after: list[Any] | None, limit: int) -> list[tuple[int, str]]:
        self.fetches.append((after, limit))
        start = [r for r in self.rows if after is None or list(r) > after]
        return start[:limit]


def _all_pages(table: Table, size: int, filters: dict[str, Any]) -> list[list[tuple[int, str]]]:
    pages, token = [], ""
    while True:
        rows, token = paginate(token, size, filters, table.fetch, lambda r: [r[0], r[1]])
        pages.append(rows)
        if not token:
            return pages


@pytest.mark.parametrize(("size", "expected_pages"), [(3, 4), (5, 2), (10, 1), (11, 1)])
def test_pages_cover_every_row_once_with_no_trailing_empty_page(
        size: int, expected_pages: int) -> None:
    table = Table(ROWS)
    pages = _all_pages(table, size, {"fleet": "f"})
    assert [r for page in pages for r in page] == ROWS
    assert len(pages) == expected_pages
    assert all(pages), "no empty page"
    assert all(limit == size + 1 for _after, limit in table.fetches)


def test_empty_listing_and_default_and_capped_sizes() -> None:
    assert paginate("", 0, {}, Table([]).fetch, lambda r: [r[0]]) == ([], "")
    table = Table(ROWS)
    paginate("", 0, {}, table.fetch, lambda r: [r[0]])
    paginate("", 10**6, {}, table.fetch, lambda r: [r[0]])
    assert [limit for _a, limit in table.fetches] == [DEFAULT_PAGE_SIZE + 1, MAX_PAGE_SIZE + 1]
    with pytest.raises(InvalidArgument):
        paginate("", -1, {}, table.fetch, lambda r: [r[0]])


def test_a_token_only_works_with_the_filters_it_was_issued_for() -> None:
    table = Table(ROWS)
    _rows, token = paginate("", 4, {"run": "a"}, table.fetch, lambda r: [r[0], r[1]])
    assert paginate(token, 4, {"run": "a"}, table.fetch, lambda r: [r[0], r[1]])[0] == ROWS[4:8]
    with pytest.raises(InvalidArgument) as other:
        paginate(token, 4, {"run": "b"}, table.fetch, lambda r: [r[0], r[1]])
    assert other.value.reason == "INVALID_PAGE_TOKEN"
    with pytest.raises(InvalidArgument):
        paginate("not-a-token", 4, {"run": "a"}, table.fetch, lambda r: [r[0]])
