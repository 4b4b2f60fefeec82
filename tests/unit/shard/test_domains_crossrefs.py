from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.shard.domain import crossrefs
from services.shard.domain.domains import (
    DEFAULT_DOMAINS,
    USAGE_HALF_LIFE_S,
    keyword_matches,
    route,
    validate_domain_name,
    with_importance,
)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("New project task: reach the goal", "projects"),
        ("Lesson learned: this pattern keeps recurring", "insights"),
        ("Met an expert builder, contact @ana", "people"),
        ("The protocol layer of the architecture", "technical"),
        ("Our strategic vision and priority trends", "strategy"),
    ],
)
def test_routes_by_keyword_matches(content: str, expected: str) -> None:
    assert route(content, with_importance(DEFAULT_DOMAINS, 0.0)) == expected


def test_importance_adds_two_times_its_value() -> None:
    now = 1_000_000.0
    domains = with_importance(
        [d.used(5, now) if d.name == "strategy" else d for d in DEFAULT_DOMAINS], now
    )
    # no keyword matches anywhere: the busiest domain (importance 1.0 -> +2) wins
    assert route("nothing in particular", domains) == "strategy"
    # two keyword matches (project, task) beat 2 x 1.0 only when strictly more: 2 vs 2 ties
    assert route("project task milestone", domains) in {"projects", "strategy"}
    assert route("project task goal", domains) == "projects"


def test_usage_decays_with_half_life() -> None:
    domain = DEFAULT_DOMAINS[0].used(4, 0.0)
    assert domain.decayed_usage(USAGE_HALF_LIFE_S) == pytest.approx(2.0)
    assert domain.record_count == 4


def test_keyword_prefix_matches() -> None:
    assert keyword_matches("Lessons and lesson-learned", ("lesson", "learned")) == 3


def test_domain_names() -> None:
    assert validate_domain_name("shard_Technical") == "technical"
    with pytest.raises(InvalidArgument):
        validate_domain_name("1bad name")


def test_detects_all_four_patterns_in_order() -> None:
    text = (
        "see shard technical, connect with shard people; voir shard strategy "
        "and shard:0123456789abcdef0123456789abcdef"
    )
    assert crossrefs.detect(text) == [
        "technical",
        "people",
        "strategy",
        "0123456789abcdef0123456789abcdef",
    ]


def test_detection_is_bounded() -> None:
    assert crossrefs.detect("see shard " + "a" * 500) == []
    many = " ".join(f"see shard d{i}" for i in range(crossrefs.MAX_CROSS_REFS + 1))
    with pytest.raises(InvalidArgument) as caught:
        crossrefs.check_count(crossrefs.detect(many))
    assert caught.value.reason == "TOO_MANY_CROSS_REFERENCES"


def test_plain_mentions_are_not_links() -> None:
    assert crossrefs.detect("the shard service and a hardshard:x") == []
