"""Limits on what a request may carry, and the JSON every service accepts.

Every limit is a setting with a default; going over it is ``INVALID_ARGUMENT`` with reason
``LIMIT_EXCEEDED`` and a message naming the limit and the setting that raises it, so a
client learns what to shrink and an operator what to change. JSON documents are checked
for size and nesting depth before they are parsed: Python's parser recurses, and a document
nested a few thousand deep would otherwise end in ``RecursionError`` (INTERNAL).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from services.common.errors import InvalidArgument
from services.common.tokens import validate_identifier

DEFAULT_JSON_DEPTH = 64


class LimitExceeded(InvalidArgument):
    default_reason = "LIMIT_EXCEEDED"


def check_limit(what: str, value: int, limit: int, setting: str, unit: str = "", *,
                reason: str | None = None) -> None:
    """Refuse ``value`` over ``limit``: ``what`` names the thing, ``setting`` the knob.

    ``reason`` keeps a reason clients already match on (``CONTENT_TOO_LARGE``); the default
    is ``LIMIT_EXCEEDED``.
    """
    if value > limit:
        suffix = f" {unit}" if unit else ""
        raise LimitExceeded(f"{what} is {value}{suffix}, over the limit of {limit}{suffix} "
                            f"({setting})", reason=reason,
                            metadata={"limit": str(limit), "setting": setting})


def validate_request_id(request_id: str) -> str:
    """An idempotency key is an identifier too (it is stored and compared as a key)."""
    try:
        return validate_identifier("request_id", request_id)
    except InvalidArgument as error:
        raise InvalidArgument(error.message, reason="INVALID_REQUEST_ID") from None


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text``, in one pass, without parsing."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} has no JSON form")


def parse_json(text: str, what: str, *, max_bytes: int, setting: str,
               max_depth: int = DEFAULT_JSON_DEPTH) -> Any:
    """Parse one JSON document a client sent; every way it can be bad is INVALID_ARGUMENT.

    Besides text that does not parse: a number too large for a float, and a string or key
    holding a lone surrogate (an escape such as ``\\ud800`` with no partner: valid JSON text,
    but no Unicode character, so its value has no UTF-8 form to store or hash).
    """
    check_limit(what, len(text.encode()), max_bytes, setting, "bytes")
    check_limit(f"{what}'s nesting depth", json_depth(text), max_depth,
                "ENGRAM_LIMITS_JSON_DEPTH")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as error:
        raise InvalidArgument(f"{what} is not valid JSON: {error}", reason="INVALID_JSON") from None
    problem = _unrepresentable(value)
    if problem:
        raise InvalidArgument(f"{what} is not valid JSON: {problem}", reason="INVALID_JSON")
    return value


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""A surrogate code point left alone in a decoded string (the parser pairs the valid ones)."""

LONE_SURROGATE_PROBLEM = ("a string holds a lone surrogate escape (\\ud800 to \\udfff "
                          "without its pair), which is no character and has no UTF-8 form")


def _unrepresentable(value: Any) -> str:
    """What in the parsed ``value`` has no JSON or UTF-8 form, or ""."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item):
                return LONE_SURROGATE_PROBLEM
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "a number too large for a float"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return ""


MAX_POLICY_DAYS = 100_000
"""The oldest age a compaction or retention policy may name (274 years): past it the cut-off
time is no longer a number the stores hold."""


def check_policy_days(older_than_days: float, *, retention: bool) -> None:
    """A policy's ``older_than_days``: finite, at most :data:`MAX_POLICY_DAYS`, over 0 for a
    retention (it removes originals) and at least 0 for a compaction. Infinity, NaN and 1e12
    reached the cut-off arithmetic and failed INTERNAL (found by review on 2026-11-30)."""
    low_ok = older_than_days > 0 if retention else older_than_days >= 0
    if not (math.isfinite(older_than_days) and low_ok and older_than_days <= MAX_POLICY_DAYS):
        bound = "over 0" if retention else "0 or more"
        raise InvalidArgument(
            f"older_than_days must be a number of days {bound} and at most {MAX_POLICY_DAYS}, "
            f"got {older_than_days}"
            + (": removing originals is explicit and needs an age" if retention else ""),
            reason="INVALID_POLICY", metadata={"limit": str(MAX_POLICY_DAYS)})
