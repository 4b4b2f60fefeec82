"""Deny patterns (RE2) agree with `re` on the common syntax, never backtrack, and refuse
backtracking constructs by name."""

from __future__ import annotations

import re

import pytest

from services.governance.domain.patterns import DenyPattern, PatternError

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
        compiled = DenyPattern(pattern, case_sensitive=case_sensitive)
        flags = re.DOTALL | (0 if case_sensitive else re.IGNORECASE)
        for text in (*texts, *(t.upper() for t in texts)):
            assert compiled.search(text) == bool(re.search(pattern, text, flags)), (pattern, text)


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)b", "(?!a)", "a**", "*a", "(a", "a)",
                                     "[z-a]", "a{5,2}", "", "x" * 501, "(a{1000}){1000}"])
def test_rejects_what_re2_cannot_compile(pattern: str) -> None:
    with pytest.raises(PatternError):
        DenyPattern(pattern)


@pytest.mark.parametrize(("pattern", "construct"), [
    (r"(a)\1", r"backreference \\1"), (r"(?P<x>a)\k<x>", "named backreference"),
    ("(?=a)b", "lookahead"), ("(?!a)b", "negative lookahead"), ("(?<=a)b", "lookbehind"),
    ("(?<!a)b", "negative lookbehind"), ("(?>a)", "atomic group"),
])
def test_backtracking_constructs_are_named(pattern: str, construct: str) -> None:
    with pytest.raises(PatternError, match=construct):
        DenyPattern(pattern)


@pytest.mark.parametrize(("pattern", "text"), [
    (r"\bword\b", "a word here"), ("(?i)SeCrEt", "secret"), ("(?P<x>ab)c", "abc"),
])
def test_re2_syntax_beyond_the_old_subset_is_accepted(pattern: str, text: str) -> None:
    assert DenyPattern(pattern, case_sensitive=True).search(text)


@pytest.mark.parametrize(("pattern", "expected"), [
    ("(a+)+$", False), ("(a|aa)*b", False), ("a*a*a*a*a*b", False), ("(x+x+)+y", False),
    ("(.*a){12}!", True), ("(a*)*!$", True),
])
def test_catastrophic_shapes_run_in_linear_time(pattern: str, expected: bool) -> None:
    # These take exponential or high-polynomial time in a backtracking engine.
    hostile = "a" * 65535 + "!"
    assert DenyPattern(pattern).search(hostile) is expected


@pytest.mark.parametrize("pattern", [r"(a|aa){1000}#", r".{1000}x", r"[^x]{0,500}y"])
def test_a_pattern_compiling_to_a_huge_program_is_refused(pattern: str) -> None:
    """Short, no backtracking construct, and RE2 compiles it; but over one 32 KB write
    ``(a|aa){1000}#`` searched for 1.3 s (the DFA outgrew its memory and RE2 fell back to
    the NFA), and every write of the fleet is searched with it (found by review)."""
    with pytest.raises(PatternError, match="RE2 instructions; the limit is 2000"):
        DenyPattern(pattern)


def test_patterns_people_write_stay_well_inside_the_program_limit() -> None:
    for pattern in (r"(?i)password|api[_-]?key|secret", r"\b\d{3}-\d{2}-\d{4}\b",
                    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}", r"(\w+\s){1,50}end"):
        DenyPattern(pattern)
