"""A JSON body's values are counted before it is parsed (engram/gateway/_json_values.py)."""

from __future__ import annotations

import json

import pytest

from engram.gateway import _transcode
from engram.gateway._json_values import MAX_JSON_VALUES, json_values, too_many_values
from engram.gateway._transcode import TranscodeError, parse_body


def _largest_batch() -> bytes:
    """The largest batch the services accept at their default limits."""
    return json.dumps({"records": [
        {"content": "x", "run_id": "r", "tags": [f"t{i}" for i in range(32)],
         "metadata": {f"k{i}": "v" for i in range(32)}} for _ in range(1000)]}).encode()


def test_a_body_of_many_small_values_is_refused_before_it_is_parsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(_raw: bytes) -> None:
        raise AssertionError("json.loads was called")

    monkeypatch.setattr(_transcode.json, "loads", parsed)
    flood = b'{"records":[' + b"{}," * MAX_JSON_VALUES + b"{}]}"
    with pytest.raises(TranscodeError) as refused:
        parse_body(flood)
    assert refused.value.reason == "JSON_TOO_MANY_VALUES"
    assert "send fewer items per call" in str(refused.value)


def test_the_largest_request_the_services_accept_is_parsed() -> None:
    body = _largest_batch()
    assert json_values(body) < MAX_JSON_VALUES
    assert len(parse_body(body)["records"]) == 1000


def test_separators_inside_strings_are_not_values() -> None:
    prose = json.dumps({"record": {"content": "one, two, {three} [four], " * 40_000}}).encode()
    assert too_many_values(prose) is None
    assert json_values(prose) == 2  # the two objects; the rough count passed the limit first
    escaped = b'{"a": "quote \\" then, commas, ' + b"x," * MAX_JSON_VALUES + b'"}'
    assert json_values(escaped) == 1
    assert too_many_values(b"[" + b"1," * MAX_JSON_VALUES + b"1]") is not None


@pytest.mark.timeout(30)  # the quadratic scan took 117 s for 180 KB, hours for this one
def test_quotes_after_backslashes_do_not_make_the_count_quadratic() -> None:
    body = b'"' + b'\\"' * 400_000 + b"," * (MAX_JSON_VALUES + 1)
    assert json_values(body) == 0  # one unterminated string: the body does not parse anyway
    body = b'["' + b'\\"' * 400_000 + b'",' + b"1," * MAX_JSON_VALUES + b"1]"
    assert too_many_values(body) is not None
