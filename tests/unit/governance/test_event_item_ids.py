"""An erasure's ``event`` item id is ``<run_id>:<seq>``, an ``iteration`` item's ``<run_id>:<n>``
(services/governance/domain/erasures.py):
the run id is held to what a run id is (an identifier of 1..128 characters), not the whole item
id, so the events of a run with a 127- or 128-character id can be erased (such an id made
every ``forget --match``/``--agent`` that touched the run refused whole); the seq is 1..2^63-1
without leading zeros, the most a store's INTEGER holds (a longer one failed ForgetRuns
INTERNAL inside the database driver)."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.governance.domain.erasures import MAX_EVENT_SEQ, ErasedItem, check_request

LEAF = "a" * 64


def _check(*items: ErasedItem) -> None:
    check_request("match", "", "why", list(items))


@pytest.mark.parametrize("item_id", [
    "r" * 128 + ":1",  # the longest run id: 130 characters in all
    "r" * 127 + ":12",
    "r" * 100 + f":{MAX_EVENT_SEQ}",
    "run:with:colons:7",  # a run id may hold ':' (the seq is after the last)
    f"run-x:{MAX_EVENT_SEQ}",
])
@pytest.mark.parametrize("kind", ["event", "iteration"])
def test_an_event_of_any_valid_run_id_and_seq_is_accepted(kind: str, item_id: str) -> None:
    _check(ErasedItem(kind, item_id, LEAF))


@pytest.mark.parametrize("item_id", [
    "r" * 129 + ":1",  # no run has so long an id
    f"run-x:{MAX_EVENT_SEQ + 1}",
    "run-x:" + "9" * 19,
    "run-x:" + "9" * 25,
    "run-x:1" + "0" * 19,
    "run-x:0", "run-x:01", "run-x:", ":1", "run x:1", "..:1", "run-x:\u0661",
])
@pytest.mark.parametrize("kind", ["event", "iteration"])
def test_an_event_id_no_run_or_store_can_hold_is_refused(kind: str, item_id: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        _check(ErasedItem(kind, item_id, LEAF))
    assert refused.value.reason == "INVALID_ITEM"


def test_other_items_are_still_identifiers_of_at_most_128_characters() -> None:
    for kind in ("record", "summary", "run", "iterations", "snapshot"):
        _check(ErasedItem(kind, "x" * 128, LEAF))
        with pytest.raises(InvalidArgument):
            _check(ErasedItem(kind, "x" * 129, LEAF))
