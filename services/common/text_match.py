"""Finding a text an erasure names (engram forget --match) in stored text, JSON and bytes.

Case-insensitive (Unicode case folding for text; for bytes, ASCII letters only). JSON is
searched both as stored and decoded, so a text stored with ``\\u`` escapes is found too.
Nothing here keeps the text: callers hold it for one request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from services.common.errors import InvalidArgument

MAX_MATCH_CHARS = 1000


def needle_of(text: str) -> str:
    """The text to look for, folded; INVALID_ARGUMENT when empty or too long."""
    if not text.strip() or len(text) > MAX_MATCH_CHARS:
        raise InvalidArgument(f"match must be 1..{MAX_MATCH_CHARS} characters of text",
                              reason="INVALID_SELECTOR")
    return text.casefold()


def holds(text: str, needle: str) -> bool:
    return needle in text.casefold()


def json_holds(stored: str, needle: str) -> bool:
    """In the JSON as stored or in its decoded strings (escapes undone)."""
    if holds(stored, needle):
        return True
    try:
        decoded = json.dumps(json.loads(stored), ensure_ascii=False)
    except ValueError:
        return False
    return holds(decoded, needle)


def bytes_hold(chunks: Iterable[bytes], needle: str) -> bool:
    """Streamed bytes hold the UTF-8 text (ASCII letters case-insensitively), across chunk
    boundaries, reading one chunk at a time."""
    wanted = needle.encode("utf-8").lower()
    tail = b""
    for chunk in chunks:
        window = tail + chunk.lower()
        if wanted in window:
            return True
        tail = window[-(len(wanted) - 1):] if len(wanted) > 1 else b""
    return False
