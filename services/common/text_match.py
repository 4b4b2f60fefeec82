"""Finding a text an erasure names (engram forget --match) in stored text, JSON and bytes.

Case-insensitive (Unicode case folding, bytes read as UTF-8). JSON is
searched both as stored and decoded, so a text stored with ``\\u`` escapes is found too.
Nothing here keeps the text: callers hold it for one request.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator

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
    """In the JSON as stored or in its decoded strings (escapes undone: a text with a quote,
    a backslash or a newline is found in the string that holds it)."""
    if holds(stored, needle):
        return True
    try:
        parsed = json.loads(stored)
    except ValueError:
        return False
    return decoded_holds(parsed, needle)


def decoded_holds(value: object, needle: str) -> bool:
    """In a parsed JSON value, written out with its characters as they are, or in one of its
    keys and strings (a text with a quote, a backslash or a newline)."""
    return holds(json.dumps(value, ensure_ascii=False), needle) or any(
        holds(text, needle) for text in json_texts(value))


def json_texts(value: object) -> Iterator[str]:
    """Every key and string of a parsed JSON value, as its writer wrote it (no escapes)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from json_texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from json_texts(item)


def bytes_hold(chunks: Iterable[bytes], needle: str) -> bool:
    """Streamed bytes hold the text, read as UTF-8 and case-folded like the rest (``MÜLLER``
    and ``Straße`` are found by ``müller`` and ``strasse``), across chunk boundaries, one
    chunk at a time. Bytes that are not UTF-8 read as U+FFFD and match nothing."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    keep = max(len(needle) - 1, 0)
    tail = ""
    for chunk in chunks:
        window = tail + decoder.decode(chunk).casefold()
        if needle in window:
            return True
        tail = window[-keep:] if keep else ""
    return needle in tail + decoder.decode(b"", final=True).casefold()
