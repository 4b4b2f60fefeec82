"""How many values a JSON body holds, counted before it is parsed.

Parsing costs memory by value, not by byte: ``[{},{},...]`` is three bytes an object, and each
object becomes a dict and then a protobuf message, about 65 bytes held for every byte of body
(measured: 1 MiB of it, +25 MiB after ``json.loads`` alone). An 8 MiB body of them took about
520 MiB before the request's size was checked, past a 512 MiB pod, with a made-up token (found
by review on 2026-11-30). A body holding more than :data:`MAX_JSON_VALUES` is refused before
it is parsed. The largest request the services accept at their default limits (1,000 records
each with 32 tags and 32 metadata entries) holds about 70,000.
"""

from __future__ import annotations

import re

MAX_JSON_VALUES = 100_000
"""The most values (array elements and object members, counted by their separators, and
containers) one JSON body may hold: at most about 20 MB parsed."""

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.S)
"""A string literal, or an unterminated one to the end of the body (a body that does not parse
either way). Possessive, so a match that cannot end is never tried again from a later quote:
with a plain pattern, quotes after backslashes made the scan quadratic, 117 s for 180 KB
(found by review on 2026-11-30)."""


def json_values(raw: bytes) -> int:
    """An upper bound of the values in ``raw`` that is exact outside strings: ``{``, ``[`` and
    ``,`` outside string literals. Counts every such byte first (fast), and only when that
    passes :data:`MAX_JSON_VALUES` strips the strings and counts again (prose is full of
    commas)."""
    rough = raw.count(b"{") + raw.count(b"[") + raw.count(b",")
    if rough <= MAX_JSON_VALUES:
        return rough
    bare = _STRING.sub(b"", raw)
    return bare.count(b"{") + bare.count(b"[") + bare.count(b",")


def too_many_values(raw: bytes) -> str | None:
    """Why ``raw`` may not be parsed (a message a person can act on), or None."""
    count = json_values(raw)
    if count <= MAX_JSON_VALUES:
        return None
    return (f"the body holds about {count} JSON values, over the {MAX_JSON_VALUES} one "
            "request may hold: send fewer items per call")
