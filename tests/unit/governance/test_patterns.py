"""The safe deny-pattern matcher agrees with `re` on the supported subset and never backtracks."""

from __future__ import annotations

import re

import pytest

from services.governance.domain.patterns import PatternError, SafePattern

CASES = [
    ("ignore.*instructions", ["please ignore all prior instructions", "instructions ignore"]),
    ("^abc", ["abcdef", "xabc", ""]),
    ("abc$", ["xxabc", "abcx", "abc"]),
    ("a{2,3}b", ["ab", "aab", "aaaab", "b"]),
    ("[^a-c]x", ["bx", "dx", "x"]),
    (r"\d+\.\d+", ["v1.2", "v1.", "12.34.5"]),
    ("(a|b)*c", ["ababd", "abac", "c"]),
    ("^$", ["", "a"]),
    ("x|^$", ["", "y", "yx"]),
    (r"\W\S", ["a !b", "ab", "a  "]),
    ("colou?r", ["color", "colour", "colr"]),
    (r"(?:api|secret)[-_ ]?key\s*[:=]", ["my api_key = 1", "secretkey:", "api kee:"]),
    ("[a-z]{3}-[0-9]{2,}", ["abc-1", "abc-12", "ab-123"]),
    (r"\$\d", ["costs $5", "costs 5$"]),
    ("a.c", ["a\nc", "ac"]),
]


@pytest.mark.parametrize(("pattern", "texts"), CASES)
def test_agrees_with_re(pattern: str, texts: list[str]) -> None:
    for case_sensitive in (True, False):
        compiled = SafePattern(pattern, case_sensitive=case_sensitive)
        flags = re.DOTALL | (0 if case_sensitive else re.IGNORECASE)
        for text in (*texts, *(t.upper() for t in texts)):
            assert compiled.search(text) == bool(re.search(pattern, text, flags)), (pattern, text)


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)b", "(?!a)", "(?P<x>a)", "(?i)a",
                                     r"\bword\b", "a**", "*a", "(a", "a)", "[z-a]", "a{5,2}",
                                     "", "x" * 501, "(a{1000}){1000}"])
def test_rejects_outside_the_safe_subset(pattern: str) -> None:
    with pytest.raises(PatternError):
        SafePattern(pattern)


@pytest.mark.parametrize(("pattern", "expected"), [
    ("(a+)+$", False), ("(a|aa)*b", False), ("a*a*a*a*a*b", False), ("(x+x+)+y", False),
    ("(.*a){12}!", True), ("(a*)*!$", True),
])
def test_catastrophic_shapes_run_in_linear_time(pattern: str, expected: bool) -> None:
    # These take exponential or high-polynomial time in a backtracking engine.
    hostile = "a" * 20000 + "!"
    assert SafePattern(pattern).search(hostile) is expected
