"""Deny patterns, matched by RE2 (``google-re2``) in time linear in the text, whatever the pattern.

Why not Python's ``re``: it backtracks, so a governor's ``(a+)+$`` over a long
write can pin a CPU for minutes, and ``re`` has no timeout. RE2 compiles to an
automaton and has no backtracking constructs at all, so a pattern that needs
one (backreferences, lookahead, lookbehind, atomic groups) is refused when the
rule is created, with a message naming the construct.

Semantics: RE2 syntax; ``.`` matches newlines too; ``^`` and ``$`` are the
start and end of the text (``(?m)`` for lines); ``\\d \\w \\s \\b`` are ASCII
(``\\pL``, ``\\pN`` for any script); matching is case-insensitive unless the
rule says otherwise (Unicode simple case folding).
"""

from __future__ import annotations

import re2

MAX_PATTERN_LENGTH = 500
MAX_PROGRAM_SIZE = 2000
"""RE2 instructions a compiled pattern may hold. RE2 is linear in the text, but its cost per
byte grows with the program, steeply once the DFA's states outgrow its memory and it falls back
to the NFA: over 32 KB of text, ``(a|aa){200}#`` (1,005 instructions) takes ~2 ms, ``{500}``
(2,505) ~14 ms and ``{1000}`` (5,005) 1.3 s. Patterns people write to deny secrets or words
are tens to hundreds of instructions."""
_MAX_PROGRAM_BYTES = 8 << 20
"""RE2's memory budget per compiled pattern (program and DFA cache)."""

_UNSUPPORTED = (
    ("invalid perl operator: (?=", "lookahead (?=...)"),
    ("invalid perl operator: (?!", "negative lookahead (?!...)"),
    ("invalid perl operator: (?<=", "lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "negative lookbehind (?<!...)"),
    ("invalid perl operator: (?>", "atomic group (?>...)"),
    ("invalid escape sequence: \\k", "named backreference \\k<...>"),
    ("invalid escape sequence: \\g", "backreference \\g..."),
)


class PatternError(ValueError):
    """The pattern cannot be compiled by RE2 or is too long; the message says why."""


def _explain(pattern: str, error: re2.error) -> str:
    raw = error.args[0] if error.args else ""
    detail = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    for prefix, construct in _UNSUPPORTED:
        if detail.startswith(prefix):
            return (f"{construct} is not supported: RE2 matches in linear time and has no "
                    f"backtracking constructs (pattern {pattern!r})")
    escape = detail.removeprefix("invalid escape sequence: \\")
    if escape != detail and escape[:1].isdigit() and escape[:1] != "0":
        return (f"backreference \\{escape} is not supported: RE2 matches in linear time and "
                f"has no backtracking constructs (pattern {pattern!r})")
    return f"RE2 cannot compile {pattern!r}: {detail}"


class DenyPattern:
    """A compiled deny pattern; :meth:`search` is linear in the text length. Thread-safe."""

    def __init__(self, pattern: str, *, case_sensitive: bool = False) -> None:
        if not pattern:
            raise PatternError("pattern must not be empty")
        if len(pattern) > MAX_PATTERN_LENGTH:
            raise PatternError(f"pattern is {len(pattern)} characters; the limit is "
                               f"{MAX_PATTERN_LENGTH}")
        options = re2.Options()
        options.case_sensitive = case_sensitive
        options.dot_nl = True
        options.log_errors = False
        options.max_mem = _MAX_PROGRAM_BYTES
        try:
            self._compiled = re2.compile(pattern, options)
        except re2.error as error:
            raise PatternError(_explain(pattern, error)) from None
        size = self._compiled.programsize
        if size > MAX_PROGRAM_SIZE:
            raise PatternError(
                f"pattern {pattern!r} compiles to {size} RE2 instructions; the limit is "
                f"{MAX_PROGRAM_SIZE} (large counted repetitions such as {{1000}} cost the most: "
                "every write is searched with it)")
        self.pattern = pattern
        self.case_sensitive = case_sensitive

    def search(self, text: str) -> bool:
        """True when the pattern matches anywhere in ``text``."""
        return self._compiled.search(text) is not None
