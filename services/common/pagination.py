"""AIP-158 page tokens: opaque to clients, bound to the query that issued them.

A token carries the last key of the page and a digest of the request's
filters; reusing it with other filters, or altering it, is INVALID_ARGUMENT.
List handlers call :func:`paginate`: it fetches one row past the page, so a
token is issued only when another row exists (never a trailing empty page).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from services.common.errors import InvalidArgument

Row = TypeVar("Row")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidArgument(f"page_size must be >= 0, got {requested}")
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def _digest(filters: dict[str, Any]) -> str:
    raw = json.dumps(filters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def encode_token(last_key: list[Any], filters: dict[str, Any]) -> str:
    body = json.dumps({"k": last_key, "f": _digest(filters)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def decode_token(token: str, filters: dict[str, Any]) -> list[Any] | None:
    """The last key of the previous page, or ``None`` for the first page."""
    if not token:
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        key, digest = body["k"], body["f"]
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument(
            "page_token is not a token this service issued", reason="INVALID_PAGE_TOKEN"
        ) from None
    if digest != _digest(filters) or not isinstance(key, list):
        raise InvalidArgument(
            "page_token was issued for a different query; repeat the original filters",
            reason="INVALID_PAGE_TOKEN",
        )
    return key


def paginate(
    page_token: str,
    requested_size: int,
    filters: dict[str, Any],
    fetch: Callable[[list[Any] | None, int], Sequence[Row]],
    key_of: Callable[[Row], list[Any]],
) -> tuple[list[Row], str]:
    """One page and the token for the next (``""`` on the last page).

    ``fetch(after_key, limit)`` returns up to ``limit`` rows after ``after_key`` (``None``
    for the first page) in the listing's order; ``key_of(row)`` is that row's sort key.
    """
    after = decode_token(page_token, filters)
    size = page_size(requested_size)
    rows = list(fetch(after, size + 1))
    if len(rows) <= size:
        return rows, ""
    return rows[:size], encode_token(key_of(rows[size - 1]), filters)
