"""VerifyRecords checks each record tombstone's form (docs/erasure.md): besides re-deriving its
leaf, it must name an erasure id of the form governance issues and when it was erased; one
written into the database by hand (``erasure_id='x'``) is INVALID_TOMBSTONE."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.common.errors import EngramError
from services.shard.service import ShardService
from tests.unit.shard.test_records_v2 import _tombstone, _v2

GOOD = "era_" + "5" * 28


@pytest.mark.parametrize("change,reason", [
    ({}, None),
    ({"erasure_id": "x"}, "INVALID_TOMBSTONE"),
    ({"erasure_id": "era_1"}, "INVALID_TOMBSTONE"),
    ({"erased_us": 0}, "INVALID_TOMBSTONE"),
    ({"importance": 0.1}, "TOMBSTONE_HASH_MISMATCH"),
])
def test_a_tombstone_names_an_erasure_id_of_governances_form(
        change: dict[str, object], reason: str | None) -> None:
    stone = replace(_tombstone(_v2(), erasure_id=GOOD), **change)  # type: ignore[arg-type]
    failures: list[EngramError] = []
    assert ShardService._check_tombstones([stone], failures) == 1
    assert [f.reason for f in failures] == ([reason] if reason else [])
