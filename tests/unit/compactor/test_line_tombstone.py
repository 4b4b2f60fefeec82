"""A format-2 warm line erased in place becomes its tombstone (docs/erasure.md): its chain
fields and the erasure, the seed's fields and salt gone; its hash still follows from what it
kept, so the chain verifies through it, and a change to any kept field, a missing or malformed
erasure id or erase time is found. A format-1 line has no tombstone form."""

from __future__ import annotations

import json

import pytest

from services.common.canonical import canonical_json
from services.compactor.domain.warm_chain import ChainWalker, WarmLine, genesis_hash
from tests.unit.compactor.support import make_iteration

F, R = "fleet-a", "run-t"
ERASURE = "era_" + "1" * 28


def _lines() -> list[WarmLine]:
    lines: list[WarmLine] = []
    prev = genesis_hash(F, R)
    for n in (1, 2, 3):
        lines.append(WarmLine.chained(make_iteration(n).validated(), n, prev, salt=f"{n:02d}" * 32))
        prev = lines[-1].hash
    return lines


def test_a_tombstone_keeps_the_chain_and_nothing_of_the_content() -> None:
    lines = _lines()
    tombstone = lines[1].tombstone(ERASURE, 1_700_000_000_000_000, "op")
    data = json.loads(tombstone.text())
    assert set(data) == {"v", "iter", "prevHash", "summaryCommitment", "detailDigest", "hash",
                         "erasureId", "erasedUs", "erasedBy"}
    assert WarmLine.parse(tombstone.text()) == tombstone
    assert tombstone.hash == lines[1].hash and tombstone.intact() and tombstone.erased
    assert not tombstone.commits_detail('{"n":2}', "null")
    assert not tombstone.same_content(make_iteration(2).validated())
    walker = ChainWalker(genesis_hash(F, R))
    walker.feed_all("log", [lines[0], tombstone, lines[2]])
    assert not walker.problems and (walker.checked, walker.tombstoned) == (3, 1)


@pytest.mark.parametrize("field, value", [
    ("iter", 3), ("prevHash", "0" * 64), ("summaryCommitment", "0" * 64),
    ("detailDigest", "0" * 64), ("hash", "0" * 64), ("erasureId", "era_nope"),
    ("erasureId", "ERA_" + "1" * 28), ("erasedUs", 0)])
def test_a_changed_tombstone_is_found(field: str, value: object) -> None:
    lines = _lines()
    data = json.loads(lines[1].tombstone(ERASURE, 5, "op").text())
    walker = ChainWalker(genesis_hash(F, R))
    walker.feed_all("log", [lines[0]])
    walker.feed_text("line", canonical_json({**data, field: value}))
    assert walker.problems, field


@pytest.mark.parametrize("change", [{"v": 1}, {"salt": "ab" * 32}])
def test_a_tombstone_is_format_2_without_a_salt(change: dict[str, object]) -> None:
    data = json.loads(_lines()[0].tombstone(ERASURE, 5, "op").text())
    with pytest.raises(ValueError):
        WarmLine.parse(canonical_json({**data, **change}))


def test_a_format_1_line_has_no_tombstone() -> None:
    old = WarmLine.chained(make_iteration(1).validated(), 1, genesis_hash(F, R))
    with pytest.raises(ValueError):
        old.tombstone(ERASURE, 5, "op")
