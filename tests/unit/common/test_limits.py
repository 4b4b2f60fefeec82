"""Limits name themselves; JSON from clients is bounded in size and depth before parsing."""

import pytest

from services.common.errors import InvalidArgument
from services.common.limits import LimitExceeded, check_limit, json_depth, parse_json
from services.common.tokens import validate_identifier


def test_a_limit_names_the_setting_that_raises_it() -> None:
    check_limit("query", 10, 10, "ENGRAM_LIMITS_QUERY_BYTES", "bytes")
    with pytest.raises(LimitExceeded) as over:
        check_limit("query", 11, 10, "ENGRAM_LIMITS_QUERY_BYTES", "bytes")
    assert over.value.reason == "LIMIT_EXCEEDED"
    assert "ENGRAM_LIMITS_QUERY_BYTES" in over.value.message
    assert over.value.metadata == {"limit": "10", "setting": "ENGRAM_LIMITS_QUERY_BYTES"}


def test_depth_counts_brackets_outside_strings_only() -> None:
    assert json_depth('{"a": [1, {"b": "[[[{{"}]}') == 3
    assert json_depth('"\\"[["') == 0
    assert json_depth("[]") == 1


def test_deep_nesting_is_refused_before_the_parser_recurses() -> None:
    text = "[" * 5000 + "]" * 5000
    with pytest.raises(LimitExceeded) as over:
        parse_json(text, "run metadata", max_bytes=1 << 20, setting="X")
    assert "nesting depth" in over.value.message


@pytest.mark.parametrize("text", ["NaN", '{"x": Infinity}', "[1e999]", "{", '"a\x00"'])
def test_what_json_cannot_hold_is_invalid_json(text: str) -> None:
    with pytest.raises(InvalidArgument) as bad:
        parse_json(text, "payload", max_bytes=1 << 20, setting="X")
    assert bad.value.reason == "INVALID_JSON"


@pytest.mark.parametrize("text", ['"\\ud800"', '{"note": "x\\udfffy"}', '{"\\udc00": 1}',
                                  '[[["\\ude00\\ud83d"]]]', '{"a": {"b": ["ok", "\\ud83d"]}}'])
def test_a_lone_surrogate_escape_is_invalid_json(text: str) -> None:
    """Valid JSON text whose string decodes to no character: the value has no UTF-8 form, so
    a caller encoding, storing or hashing it would fail (UnicodeEncodeError, INTERNAL)."""
    with pytest.raises(InvalidArgument) as bad:
        parse_json(text, "detail_json", max_bytes=1 << 20, setting="X")
    assert bad.value.reason == "INVALID_JSON"
    assert "lone surrogate" in bad.value.message


def test_a_surrogate_pair_is_one_character() -> None:
    value = parse_json('{"\\ud83d\\ude00": "\\ud83d\\ude00"}', "p", max_bytes=100, setting="X")
    assert value == {"\U0001F600": "\U0001F600"}


def test_size_is_checked_in_bytes() -> None:
    with pytest.raises(LimitExceeded):
        parse_json('"' + "é" * 6 + '"', "payload", max_bytes=10, setting="X")
    assert parse_json('{"ok": [1, 2.5]}', "payload", max_bytes=100, setting="X") == {"ok": [1, 2.5]}


@pytest.mark.parametrize("value", [".", "..", "...", "a\x00b", "tab\there", "new\nline"])
def test_identifiers_that_would_escape_a_path_or_hide_bytes_are_refused(value: str) -> None:
    with pytest.raises(InvalidArgument) as bad:
        validate_identifier("run_id", value)
    assert bad.value.reason == "INVALID_IDENTIFIER"
