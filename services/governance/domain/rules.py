"""Write rules (managed by governors) and the judge that applies them to a candidate.

A rule has a kind, kind-specific parameters (validated here, stored as JSON)
and the tiers it applies to (empty: every tier). Suspended agents are always
denied by the built-in rule ``builtin:suspended``; no rule can lift that.

Rules that read text judge the whole record, not only its content: a deny
pattern is searched in the content, each tag, the source and each metadata
key and value, and a size limit counts all of them together, so a secret
moved out of the content into a tag or a metadata value is refused the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from services.common.errors import InvalidArgument
from services.governance.domain.contradiction import DEFAULT_MIN_OVERLAP, first_contradiction
from services.governance.domain.patterns import DenyPattern, PatternError
from services.governance.domain.tiers import AgentTrust, TrustTier

SUSPENDED_RULE_ID = "builtin:suspended"
MAX_TAGS = 64
MAX_NAME_CHARS = 256
"""A required tag or an allowed domain: longer than any the shard takes (tags 64 characters by
default, ENGRAM_LIMITS_TAG_CHARS; domain names 64)."""
MAX_RATE_WINDOW_SECONDS = 7 * 24 * 3600


class RuleKind(StrEnum):
    SIZE_LIMIT = "size_limit"
    DENY_PATTERN = "deny_pattern"
    REQUIRED_TAGS = "required_tags"
    DOMAIN_ACCESS = "domain_access"
    RATE_LIMIT = "rate_limit"
    CONTRADICTION = "contradiction"


@dataclass(frozen=True)
class Rule:
    rule_id: str
    fleet_id: str
    kind: RuleKind
    params: Mapping[str, Any]
    description: str = ""
    tiers: tuple[TrustTier, ...] = ()
    created_by: str = ""
    created_ms: int = 0

    def applies_to(self, tier: TrustTier) -> bool:
        return not self.tiers or tier in self.tiers

    @cached_property
    def deny_pattern(self) -> DenyPattern | PatternError:
        """A deny-pattern rule's pattern, compiled once for this rule object (the gate keeps a
        fleet's rules until one changes, so their patterns are compiled once a change), or
        why it no longer compiles. Compiled patterns are not shared between fleets: a cache
        of every fleet's patterns would let many fleets' patterns push out each other's, and
        each write would compile its fleet's again."""
        try:
            return DenyPattern(self.params["pattern"],
                               case_sensitive=self.params["case_sensitive"])
        except PatternError as error:
            return error

    def state(self) -> dict[str, object]:
        """What the witness chain records about this rule."""
        return {"rule_id": self.rule_id, "fleet_id": self.fleet_id, "kind": self.kind.value,
                "params": dict(self.params), "description": self.description,
                "tiers": [t.value for t in self.tiers], "created_by": self.created_by,
                "created_ms": self.created_ms}


@dataclass(frozen=True)
class Neighbour:
    record_id: str
    content: str
    agent_id: str = ""
    score: float = 0.0


@dataclass(frozen=True)
class Candidate:
    record_id: str
    content_hash: str
    content: str
    run_id: str = ""
    domain: str = ""
    source: str = ""
    importance: float = 0.5
    tags: tuple[str, ...] = ()
    neighbours: tuple[Neighbour, ...] = field(default_factory=tuple)
    metadata: tuple[tuple[str, str], ...] = ()
    """``(key, value)`` pairs, sorted by key."""

    def texts(self) -> Iterator[tuple[str, str]]:
        """Every text of the record a rule reads, each with the name of its field."""
        yield "content", self.content
        for tag in self.tags:
            yield "a tag", tag
        yield "the source", self.source
        for key, value in self.metadata:
            yield "a metadata key", key
            yield f"metadata value {key!r}", value

    def size_bytes(self) -> int:
        """UTF-8 bytes of everything :meth:`texts` yields."""
        return sum(len(text.encode()) for _, text in self.texts())


@dataclass(frozen=True)
class Violation:
    rule_id: str
    message: str


def _positive_int(params: Mapping[str, Any], key: str, kind: RuleKind, upper: int) -> int:
    value = params.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= upper:
        raise InvalidArgument(f"{kind.value} rule needs {key} between 1 and {upper}, got {value!r}",
                              reason="INVALID_RULE")
    return value


def _names(params: Mapping[str, Any], key: str, kind: RuleKind) -> list[str]:
    values = params.get(key) or []
    if (not isinstance(values, list) or not values or len(values) > MAX_TAGS
            or not all(isinstance(v, str) and v.strip() for v in values)):
        raise InvalidArgument(f"{kind.value} rule needs 1..{MAX_TAGS} non-empty {key}",
                              reason="INVALID_RULE")
    # A tag or domain name longer than any the shard takes could never be met; unbounded, a
    # governor's create-and-delete cycle of one rule added megabytes to the chain every fleet
    # verifies (found by a review, 2026-11-29).
    if any(len(v.strip()) > MAX_NAME_CHARS for v in values):
        raise InvalidArgument(f"{kind.value} rule: each of {key} may have at most "
                              f"{MAX_NAME_CHARS} characters", reason="INVALID_RULE")
    return sorted({v.strip() for v in values})


def validate_params(kind: RuleKind, params: Mapping[str, Any]) -> dict[str, Any]:
    """Normalised parameters for ``kind``; ``InvalidArgument`` says what is wrong."""
    if kind is RuleKind.SIZE_LIMIT:
        return {"max_bytes": _positive_int(params, "max_bytes", kind, 64 * 1024 * 1024)}
    if kind is RuleKind.DENY_PATTERN:
        pattern = params.get("pattern")
        case_sensitive = bool(params.get("case_sensitive", False))
        if not isinstance(pattern, str):
            raise InvalidArgument("deny_pattern rule needs a pattern", reason="INVALID_RULE")
        try:
            DenyPattern(pattern, case_sensitive=case_sensitive)
        except PatternError as error:
            raise InvalidArgument(f"deny pattern refused: {error}",
                                  reason="UNSAFE_PATTERN") from None
        return {"pattern": pattern, "case_sensitive": case_sensitive}
    if kind is RuleKind.REQUIRED_TAGS:
        return {"tags": _names(params, "tags", kind)}
    if kind is RuleKind.DOMAIN_ACCESS:
        return {"allowed_domains": _names(params, "allowed_domains", kind)}
    if kind is RuleKind.RATE_LIMIT:
        return {"max_writes": _positive_int(params, "max_writes", kind, 1_000_000),
                "window_seconds": _positive_int(params, "window_seconds", kind,
                                                MAX_RATE_WINDOW_SECONDS)}
    overlap = params.get("min_overlap") or DEFAULT_MIN_OVERLAP
    if not isinstance(overlap, int | float) or not 0 < overlap <= 1:
        raise InvalidArgument(f"contradiction min_overlap must be in (0, 1], got {overlap!r}",
                              reason="INVALID_RULE")
    return {"min_overlap": float(overlap)}


WritesWithin = Callable[[int], int]
"""Accepted writes of the agent in the last ``window_seconds`` (for rate rules)."""

PatternKey = tuple[str, bool]
"""A deny pattern and whether it is case-sensitive."""
PatternVerdicts = Mapping[PatternKey, str | None]
"""What :func:`denied_by_patterns` found for one candidate: each pattern's violation or None."""

MAX_RULES_PER_FLEET = 100
"""Rules one fleet may hold: every write of the fleet is judged against all that apply."""


def denied_by_patterns(candidate: Candidate, rules: Sequence[Rule],
                       before_each: Callable[[], None] = lambda: None,
                       ) -> dict[PatternKey, str | None]:
    """The candidate against every deny pattern among ``rules``: the costly part of judging
    (RE2 over up to 32 KB of content and 8 KB of metadata per pattern), done before the gate's
    lock is taken, in the caller's own thread (RE2 lets go of the GIL), so one fleet's patterns
    cannot hold the gate for another fleet's writes. ``before_each`` runs before each search
    (it raises to stop them: the caller has gone)."""
    found: dict[PatternKey, str | None] = {}
    for rule in rules:
        if rule.kind is RuleKind.DENY_PATTERN:
            key = (rule.params["pattern"], rule.params["case_sensitive"])
            if key not in found:
                before_each()
                found[key] = _denied_text(rule, candidate)
    return found


def needs_neighbours(trust: AgentTrust, rules: Sequence[Rule]) -> bool:
    """Whether judging this agent's write (at its current tier) reads the neighbours."""
    return trust.tier is not TrustTier.SUSPENDED and any(
        rule.kind is RuleKind.CONTRADICTION and rule.applies_to(trust.tier) for rule in rules)


def judge(candidate: Candidate, trust: AgentTrust, rules: Sequence[Rule],
          writes_within: WritesWithin,
          patterns: PatternVerdicts | None = None) -> list[Violation]:
    """Every rule the candidate breaks; empty means allowed. ``patterns``: deny-pattern
    verdicts found beforehand (:func:`denied_by_patterns`); a pattern not among them (a rule
    made meanwhile) is searched here."""
    if trust.tier is TrustTier.SUSPENDED:
        return [Violation(SUSPENDED_RULE_ID, f"agent {trust.agent_id} is suspended")]
    violations = []
    for rule in rules:
        if rule.applies_to(trust.tier):
            message = _check(rule, candidate, writes_within, patterns or {})
            if message is not None:
                violations.append(Violation(rule.rule_id, message))
    return violations


def _check(rule: Rule, candidate: Candidate, writes_within: WritesWithin,
           patterns: PatternVerdicts) -> str | None:
    p = rule.params
    if rule.kind is RuleKind.SIZE_LIMIT:
        size = candidate.size_bytes()
        return (f"the record (content, tags, source and metadata) is {size} bytes, over the "
                f"{p['max_bytes']}-byte limit") if size > p["max_bytes"] else None
    if rule.kind is RuleKind.DENY_PATTERN:
        key = (p["pattern"], p["case_sensitive"])
        return patterns[key] if key in patterns else _denied_text(rule, candidate)
    if rule.kind is RuleKind.REQUIRED_TAGS:
        missing = sorted(set(p["tags"]) - set(candidate.tags))
        return f"missing required tags: {', '.join(missing)}" if missing else None
    if rule.kind is RuleKind.DOMAIN_ACCESS:
        allowed = p["allowed_domains"]
        return None if candidate.domain in allowed else (
            f"domain {candidate.domain!r} is not open to this tier "
            f"(allowed: {', '.join(allowed)})")
    if rule.kind is RuleKind.RATE_LIMIT:
        done = writes_within(p["window_seconds"])
        return f"rate limit: {done} writes in the last {p['window_seconds']} s " \
            f"(limit {p['max_writes']})" if done >= p["max_writes"] else None
    neighbours = ((n.record_id, n.content) for n in candidate.neighbours)
    clash = first_contradiction(candidate.content, neighbours, p["min_overlap"])
    return f"contradicts existing record {clash}" if clash else None


def _denied_text(rule: Rule, candidate: Candidate) -> str | None:
    """Which field matches the rule's deny pattern (named, never quoted), or None."""
    compiled = rule.deny_pattern
    if isinstance(compiled, PatternError):  # stored before RE2, refused by it: fail closed
        return f"the deny pattern no longer compiles ({compiled}); recreate the rule"
    for field_name, text in candidate.texts():
        if compiled.search(text):
            return f"{field_name} matches the deny pattern {rule.params['pattern']!r}"
    return None
