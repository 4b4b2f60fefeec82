"""Canonical JSON is pinned byte for byte: every chain and content hash depends on it."""

import hashlib
import math

import pytest

from services.common.canonical import canonical_bytes, canonical_json

SAMPLE = {"z": [1, 2.5, None, True], "a": {"é": "naïve ✓", "b": ""}, "m": -0.0, "n": 10**20}
PINNED = '{"a":{"b":"","é":"naïve ✓"},"m":-0.0,"n":100000000000000000000,"z":[1,2.5,null,true]}'


def test_canonical_text_is_pinned() -> None:
    assert canonical_json(SAMPLE) == PINNED
    assert canonical_bytes(SAMPLE) == PINNED.encode("utf-8")
    assert hashlib.sha256(canonical_bytes(SAMPLE)).hexdigest() == (
        hashlib.sha256(PINNED.encode()).hexdigest())


def test_key_order_does_not_change_the_bytes() -> None:
    assert canonical_json({"b": 1, "a": 2}) == canonical_json({"a": 2, "b": 1}) == '{"a":2,"b":1}'


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": bad})
