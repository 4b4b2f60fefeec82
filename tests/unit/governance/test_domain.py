"""Tiers and accumulator, rules and the judge, contradictions, witness-chain links."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.common.errors import InvalidArgument
from services.governance.domain import rules as rules_module
from services.governance.domain.contradiction import contradicts
from services.governance.domain.rules import (
    MAX_RULES_PER_FLEET,
    SUSPENDED_RULE_ID,
    Candidate,
    Neighbour,
    Rule,
    RuleKind,
    judge,
    validate_params,
)
from services.governance.domain.tiers import AgentTrust, TrustAccumulator, TrustTier
from services.governance.domain.witness import (
    GENESIS,
    Checkpoint,
    extends,
    next_entry,
    verify_links,
)


def test_accumulator_moves_tiers_unless_pinned() -> None:
    acc = TrustAccumulator()
    trust = AgentTrust("f", "a")
    for _ in range(3):
        trust = acc.record_outcome(trust, accepted=False, now_ms=1)
    assert (trust.tier, trust.score) == (TrustTier.PROBATION, 380)
    for _ in range(200):
        trust = acc.record_outcome(trust, accepted=True, now_ms=2)
    assert (trust.tier, trust.score) == (TrustTier.TRUSTED, 1000)
    pinned = acc.operator_sets(trust, TrustTier.SUSPENDED, now_ms=3)
    for _ in range(50):
        pinned = acc.record_outcome(pinned, accepted=True, now_ms=4)
    assert pinned.tier is TrustTier.SUSPENDED and pinned.multiplier == 0.0
    assert TrustTier.parse(" Probation ") is TrustTier.PROBATION
    with pytest.raises(ValueError, match="unknown tier"):
        TrustTier.parse("root")


def _rule(kind: RuleKind, tiers: tuple[TrustTier, ...] = (), **params: object) -> Rule:
    return Rule(f"r-{kind.value}", "f", kind, validate_params(kind, params), tiers=tiers)


def test_judge_applies_rules_by_tier() -> None:
    rules = [
        _rule(RuleKind.SIZE_LIMIT, max_bytes=20),
        _rule(RuleKind.REQUIRED_TAGS, (TrustTier.PROBATION,), tags=["reviewed"]),
        _rule(RuleKind.RATE_LIMIT, max_writes=2, window_seconds=60),
        _rule(RuleKind.CONTRADICTION),
    ]
    candidate = Candidate("r1", "h1", "the cache is enabled",
                          neighbours=(Neighbour("old", "the cache is disabled"),))
    standard = AgentTrust("f", "a")
    found = judge(candidate, standard, rules, lambda _window: 2)
    assert [v.rule_id for v in found] == ["r-rate_limit", "r-contradiction"]
    probation = replace(standard, tier=TrustTier.PROBATION)
    found = judge(replace(candidate, content="x" * 21, neighbours=()), probation, rules,
                  lambda _window: 0)
    assert [v.rule_id for v in found] == ["r-size_limit", "r-required_tags"]
    suspended = replace(standard, tier=TrustTier.SUSPENDED)
    assert [v.rule_id for v in judge(candidate, suspended, [], lambda _w: 0)] == \
        [SUSPENDED_RULE_ID]


@pytest.mark.parametrize(("field", "candidate"), [
    ("content", Candidate("r", "h", "db password=hunter2")),
    ("a tag", Candidate("r", "h", "notes", tags=("ok", "db password=hunter2"))),
    ("the source", Candidate("r", "h", "notes", source="password:hunter2")),
    ("a metadata key", Candidate("r", "h", "notes", metadata=(("password=x", "v"),))),
    ("metadata value 'note'", Candidate("r", "h", "notes", metadata=(("note", "password=x"),))),
])
def test_a_deny_pattern_judges_every_text_of_the_record(field: str, candidate: Candidate) -> None:
    rules = [_rule(RuleKind.DENY_PATTERN, pattern="password[:=]", case_sensitive=False)]
    found = judge(candidate, AgentTrust("f", "a"), rules, lambda _w: 0)
    assert [v.rule_id for v in found] == ["r-deny_pattern"]
    assert found[0].message.startswith(f"{field} matches") and "hunter2" not in found[0].message


def test_a_size_limit_counts_every_text_of_the_record() -> None:
    rules = [_rule(RuleKind.SIZE_LIMIT, max_bytes=20)]
    small = Candidate("r", "h", "0123456789", tags=("abcde",), source="src")
    assert small.size_bytes() == 18 and not judge(small, AgentTrust("f", "a"), rules, lambda _w: 0)
    big = replace(small, metadata=(("k", "vv"),))
    assert [v.rule_id for v in judge(big, AgentTrust("f", "a"), rules, lambda _w: 0)] == [
        "r-size_limit"]


@pytest.mark.parametrize(("kind", "params"), [
    (RuleKind.SIZE_LIMIT, {"max_bytes": 0}),
    (RuleKind.DENY_PATTERN, {"pattern": "(?<=x)y"}),
    (RuleKind.REQUIRED_TAGS, {"tags": []}),
    (RuleKind.RATE_LIMIT, {"max_writes": 5}),
    (RuleKind.CONTRADICTION, {"min_overlap": 2}),
])
def test_invalid_rule_params_are_refused(kind: RuleKind, params: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        validate_params(kind, params)


@pytest.mark.parametrize(("new", "old", "expected"), [
    ("The deploy port is 8080", "The deploy port is 9090", True),
    ("Feature flags are enabled in prod", "Feature flags are disabled in prod", True),
    ("The API doesn't require auth", "The API requires auth", True),
    ("The API requires auth for refunds too", "The API requires auth", False),
    ("Alice leads payments", "Bob enjoys hiking", False),
    ("Caching is not safe here", "Caching is not safe here at all", False),
])
def test_contradiction_judge(new: str, old: str, expected: bool) -> None:
    assert contradicts(new, old) is expected


def test_chain_links_detect_edits_and_extension() -> None:
    head = Checkpoint(GENESIS, 0)
    entries = []
    for i in range(4):
        entry = next_entry(head, "tier.set", {"i": i})
        entries.append(entry)
        head = Checkpoint(entry.link, entry.seq + 1)
    reached, problems = verify_links(entries)
    assert reached == head and problems == []
    edited = [*entries[:2], replace(entries[2], payload_json='{"i":99}'), entries[3]]
    assert any("entry 2" in p for p in verify_links(edited)[1])
    assert verify_links([entries[0], *entries[2:]])[1]
    assert extends(Checkpoint(entries[1].link, 2), entries[1].link)
    assert not extends(Checkpoint(entries[1].link, 2), entries[0].link)
    assert extends(Checkpoint(GENESIS, 0), None)


def test_a_fleet_s_deny_patterns_are_compiled_once_however_many_other_fleets_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rule compiles its pattern once. Before, one cache of 1,024 compiled patterns
    served every fleet: 11 fleets of 100 deny rules (the limit a fleet may hold) pushed each
    other's out, and every write compiled its fleet's patterns again (this test compiled the
    first fleet's pattern twice then)."""
    mine = [_rule(RuleKind.DENY_PATTERN, pattern="password[:=]", case_sensitive=False)]
    others = [[_rule(RuleKind.DENY_PATTERN, pattern=f"secret-{fleet}-{n}", case_sensitive=False)
               for n in range(MAX_RULES_PER_FLEET)] for fleet in range(11)]
    compiled: list[str] = []  # from here on: the rules are made (and validated)
    real = rules_module.DenyPattern

    def counting(pattern: str, *, case_sensitive: bool = False) -> object:
        compiled.append(pattern)
        return real(pattern, case_sensitive=case_sensitive)

    monkeypatch.setattr(rules_module, "DenyPattern", counting)
    candidate = Candidate("r", "h", "db password=hunter2")
    for _ in range(3):
        assert judge(candidate, AgentTrust("f", "a"), mine, lambda _w: 0)
        for rules in others:
            assert not judge(candidate, AgentTrust("f", "a"), rules, lambda _w: 0)
    assert compiled.count("password[:=]") == 1
    assert len(compiled) == 1 + 11 * MAX_RULES_PER_FLEET


@pytest.mark.parametrize(("kind", "key"), [(RuleKind.REQUIRED_TAGS, "tags"),
                                           (RuleKind.DOMAIN_ACCESS, "allowed_domains")])
def test_a_rule_names_no_tag_or_domain_longer_than_the_shard_takes(kind: RuleKind,
                                                                   key: str) -> None:
    """Found by a review (2026-11-29): a 5 MB domain name was accepted, and a governor's
    create-and-delete cycle of such a rule added 16 MB to the chain every fleet verifies."""
    params = {key: ["ok", "x" * (rules_module.MAX_NAME_CHARS + 1)]}
    with pytest.raises(InvalidArgument, match="at most 256 characters"):
        validate_params(kind, params)
    params[key] = ["ok", "x" * rules_module.MAX_NAME_CHARS]
    assert validate_params(kind, params)[key][1] == "x" * rules_module.MAX_NAME_CHARS
