"""Deny patterns matched in time linear in the content, whatever the pattern.

Why not Python's ``re``: it backtracks, so a governor's ``(a+)+$`` or even
``a*a*a*b`` over a long write can pin a CPU for minutes, and ``re`` has no
timeout. Rejecting "dangerous" shapes is a guessing game (polynomial blow-ups
slip through), so instead patterns from a safe subset of the familiar syntax
are parsed here, compiled to a Thompson NFA and run as a lazily built DFA (the
RE2 approach): each content character costs one table lookup, or one NFA step
(bounded by the pattern size) the first time a state/character pair is seen.

Supported: literals, ``.`` (any character, newlines too), ``[...]`` classes
with ranges and negation, ``\\d \\w \\s \\D \\W \\S``, escapes, groups
``(...)`` and ``(?:...)``, ``|``, ``* + ? {n} {n,} {n,m}`` (a lazy ``?``
suffix is accepted: only whether there is a match matters), ``^`` and ``$``
(start and end of the content). Rejected with a readable message:
backreferences, lookaround, named groups, inline flags, ``\\b``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_PATTERN_LENGTH = 500
MAX_NFA_STATES = 4000
MAX_REPEAT = 1000
_DFA_STATE_LIMIT = 5000

_CHAR, _SPLIT, _BOL, _EOL, _MATCH = range(5)


class PatternError(ValueError):
    """The pattern is outside the safe subset or malformed; the message says why."""


@dataclass(frozen=True)
class CharSet:
    negated: bool = False
    ranges: tuple[tuple[str, str], ...] = ()
    categories: frozenset[str] = frozenset()
    any_char: bool = False

    def matches(self, c: str, fold: bool) -> bool:
        hit = self._hit(c) or (fold and (self._hit(c.upper()) or self._hit(c.lower())))
        return hit != self.negated

    def _hit(self, c: str) -> bool:
        if self.any_char:
            return True
        for lo, hi in self.ranges:
            if lo <= c <= hi:
                return True
        return any(_in_category(c, cat) for cat in self.categories)


def _in_category(c: str, cat: str) -> bool:
    if cat in "dD":
        hit = c.isdecimal()
    elif cat in "wW":
        hit = c.isalnum() or c == "_"
    else:
        hit = c.isspace()
    return hit if cat.islower() else not hit


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_REJECTED_ESCAPES = {
    "b": "word boundaries (\\b) are not supported; match the surrounding characters instead",
    "B": "\\B is not supported",
    "A": "use ^ for the start of the content",
    "Z": "use $ for the end of the content",
    "z": "use $ for the end of the content",
}

@dataclass(frozen=True)
class _Set:
    chars: CharSet


@dataclass(frozen=True)
class _Anchor:
    end: bool


@dataclass(frozen=True)
class _Cat:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class _Alt:
    branches: tuple[Node, ...]


@dataclass(frozen=True)
class _Rep:
    body: Node
    lo: int
    hi: int | None


Node = _Set | _Anchor | _Cat | _Alt | _Rep


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str) -> PatternError:
        return PatternError(f"{message} (at position {self.pos} of {self.text!r})")

    def peek(self) -> str | None:
        return self.text[self.pos] if self.pos < len(self.text) else None

    def take(self) -> str:
        if self.pos >= len(self.text):
            raise self.fail("pattern ends too early")
        c = self.text[self.pos]
        self.pos += 1
        return c

    def parse(self) -> Node:
        node = self.alternation()
        if self.pos != len(self.text):
            raise self.fail("unbalanced ')'")
        return node

    def alternation(self) -> Node:
        branches = [self.concat()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.concat())
        return branches[0] if len(branches) == 1 else _Alt(tuple(branches))

    def concat(self) -> Node:
        items: list[Node] = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.repeat())
        return _Cat(tuple(items))

    def repeat(self) -> Node:
        atom = self.atom()
        c = self.peek()
        bounds: tuple[int, int | None] | None = None
        if c == "*":
            bounds = (0, None)
        elif c == "+":
            bounds = (1, None)
        elif c == "?":
            bounds = (0, 1)
        elif c == "{" and self._looks_counted():
            bounds = self.counted()
        if bounds is None:
            return atom
        if c != "{":
            self.pos += 1
        if self.peek() == "?":
            self.pos += 1
        stacked = self.peek() in ("*", "+") or (self.peek() == "{" and self._looks_counted())
        if stacked:
            raise self.fail("a quantifier cannot follow another quantifier; use a group")
        if isinstance(atom, _Anchor):
            raise self.fail("^ and $ cannot be repeated")
        return _Rep(atom, bounds[0], bounds[1])

    def _looks_counted(self) -> bool:
        end = self.text.find("}", self.pos)
        body = self.text[self.pos + 1 : end] if end > 0 else ""
        lo, _, hi = body.partition(",")
        return bool(lo.isdigit() and (hi == "" or hi.isdigit()))

    def counted(self) -> tuple[int, int | None]:
        end = self.text.index("}", self.pos)
        body = self.text[self.pos + 1 : end]
        self.pos = end + 1
        lo_text, comma, hi_text = body.partition(",")
        lo = int(lo_text)
        hi: int | None = lo if not comma else (int(hi_text) if hi_text else None)
        if lo > MAX_REPEAT or (hi is not None and (hi > MAX_REPEAT or hi < lo)):
            raise self.fail(f"repeat counts must satisfy 0 <= n <= m <= {MAX_REPEAT}")
        return lo, hi

    def atom(self) -> Node:
        c = self.take()
        if c == "(":
            if self.peek() == "?":
                if self.text[self.pos : self.pos + 2] != "?:":
                    raise self.fail(
                        "only (...) and (?:...) groups are supported (no lookaround, "
                        "named groups or inline flags)"
                    )
                self.pos += 2
            node = self.alternation()
            if self.peek() != ")":
                raise self.fail("missing ')'")
            self.pos += 1
            return node
        if c == "[":
            return _Set(self.char_class())
        if c == ".":
            return _Set(CharSet(any_char=True))
        if c == "^":
            return _Anchor(end=False)
        if c == "$":
            return _Anchor(end=True)
        if c == "\\":
            return self.escape()
        if c in "*+?":
            raise self.fail(f"nothing to repeat before {c!r}")
        if c == ")":
            raise self.fail("unbalanced ')'")
        return _Set(CharSet(ranges=((c, c),)))

    def escape(self) -> Node:
        c = self.take()
        if c in "dwsDWS":
            return _Set(CharSet(categories=frozenset(c)))
        escaped = self._escaped_char(c)
        return _Set(CharSet(ranges=((escaped, escaped),)))

    def _escaped_char(self, c: str) -> str:
        if c.isdigit() and c != "0":
            raise self.fail("backreferences are not supported")
        if c in _REJECTED_ESCAPES:
            raise self.fail(_REJECTED_ESCAPES[c])
        if c in _ESCAPES:
            return _ESCAPES[c]
        if c.isalnum():
            raise self.fail(f"unknown escape \\{c}")
        return c

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[str, str]] = []
        categories: set[str] = set()
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            if c == "\\":
                e = self.take()
                if e in "dwsDWS":
                    categories.add(e)
                    continue
                c = self._escaped_char(e)
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                hi = self.take()
                if hi == "\\":
                    hi = self._escaped_char(self.take())
                if hi < c:
                    raise self.fail(f"bad range {c}-{hi}")
                ranges.append((c, hi))
            else:
                ranges.append((c, c))
        return CharSet(negated=negated, ranges=tuple(ranges), categories=frozenset(categories))


@dataclass
class _Nfa:
    kinds: list[int] = field(default_factory=list)
    outs: list[list[int]] = field(default_factory=list)
    sets: list[CharSet | None] = field(default_factory=list)

    def add(self, kind: int, outs: list[int], charset: CharSet | None = None) -> int:
        if len(self.kinds) >= MAX_NFA_STATES:
            raise PatternError(
                f"pattern too large once repeats are expanded (over {MAX_NFA_STATES} states)"
            )
        self.kinds.append(kind)
        self.outs.append(outs)
        self.sets.append(charset)
        return len(self.kinds) - 1

    def compile(self, node: Node, nxt: int) -> int:
        if isinstance(node, _Set):
            return self.add(_CHAR, [nxt], node.chars)
        if isinstance(node, _Anchor):
            return self.add(_EOL if node.end else _BOL, [nxt])
        if isinstance(node, _Cat):
            for item in reversed(node.items):
                nxt = self.compile(item, nxt)
            return nxt
        if isinstance(node, _Alt):
            return self.add(_SPLIT, [self.compile(b, nxt) for b in node.branches])
        if node.hi is None:
            loop = self.add(_SPLIT, [])
            self.outs[loop] = [self.compile(node.body, loop), nxt]
            nxt = loop
        else:
            for _ in range(node.hi - node.lo):
                nxt = self.add(_SPLIT, [self.compile(node.body, nxt), nxt])
        for _ in range(node.lo):
            nxt = self.compile(node.body, nxt)
        return nxt


class _DfaTables:
    def __init__(self) -> None:
        self.ids: dict[frozenset[int], int] = {}
        self.sets: list[frozenset[int]] = []
        self.matching: list[bool] = []
        self.transitions: list[dict[str, int]] = []

    def intern(self, states: frozenset[int], matching: bool) -> int:
        found = self.ids.get(states)
        if found is not None:
            return found
        self.ids[states] = len(self.sets)
        self.sets.append(states)
        self.matching.append(matching)
        self.transitions.append({})
        return len(self.sets) - 1


class SafePattern:
    """A compiled deny pattern; :meth:`search` is linear in the text length."""

    def __init__(self, pattern: str, *, case_sensitive: bool = False) -> None:
        if not pattern:
            raise PatternError("pattern must not be empty")
        if len(pattern) > MAX_PATTERN_LENGTH:
            raise PatternError(f"pattern is {len(pattern)} characters; the limit is "
                               f"{MAX_PATTERN_LENGTH}")
        self.pattern = pattern
        self.case_sensitive = case_sensitive
        self._fold = not case_sensitive
        tree = _Parser(pattern).parse()
        self._nfa = _Nfa()
        match_state = self._nfa.add(_MATCH, [])
        self._start = self._nfa.compile(tree, match_state)
        self._lock = threading.Lock()
        self._mid_start = self._closure([self._start], at_start=False)
        self._tables = self._new_tables()

    def _new_tables(self) -> _DfaTables:
        tables = _DfaTables()
        self._intern(tables, self._closure([self._start], at_start=True))
        return tables

    def _closure(self, seeds: Iterable[int], at_start: bool, at_end: bool = False
                 ) -> frozenset[int]:
        kinds, outs = self._nfa.kinds, self._nfa.outs
        seen: set[int] = set()
        kept: set[int] = set()
        stack = list(seeds)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            kind = kinds[s]
            if kind == _SPLIT or (kind == _BOL and at_start) or (kind == _EOL and at_end):
                stack.extend(outs[s])
            elif kind in (_CHAR, _MATCH) or (kind == _EOL and not at_end):
                kept.add(s)
        return frozenset(kept)

    def _intern(self, tables: _DfaTables, states: frozenset[int]) -> int:
        return tables.intern(states, any(self._nfa.kinds[s] == _MATCH for s in states))

    def _step(self, tables: _DfaTables, state: int, c: str) -> int:
        with self._lock:
            nfa = self._nfa
            moved = [nfa.outs[s][0] for s in tables.sets[state]
                     if nfa.kinds[s] == _CHAR and nfa.sets[s].matches(c, self._fold)]  # type: ignore[union-attr]
            target = self._intern(tables, self._closure(moved, at_start=False) | self._mid_start)
            tables.transitions[state][c] = target
            return target

    def search(self, text: str) -> bool:
        """True when the pattern matches anywhere in ``text``."""
        tables = self._tables
        if len(tables.sets) > _DFA_STATE_LIMIT:
            with self._lock:
                tables = self._tables = self._new_tables()
        if self._fold:
            text = text.lower()
        state = 0
        matching, transitions = tables.matching, tables.transitions
        if matching[state]:
            return True
        for c in text:
            nxt = transitions[state].get(c)
            state = self._step(tables, state, c) if nxt is None else nxt
            if matching[state]:
                return True
        pending = [self._nfa.outs[s][0] for s in tables.sets[state]
                   if self._nfa.kinds[s] == _EOL]
        final = self._closure(pending, at_start=not text, at_end=True)
        return any(self._nfa.kinds[s] == _MATCH for s in final)
