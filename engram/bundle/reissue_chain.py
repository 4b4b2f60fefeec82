"""What re-linking a hash chain needs in ``--reissue-ids``, for a run's events and an
iteration log's lines alike (:mod:`engram.bundle.reissue_runs`,
:mod:`engram.bundle.reissue_lines`): the leaves the bundle's erasures list, those of them the
bundle holds after re-addressing, and within one pass over the bundle's order each chain's
last new link. Memory: the erasures' leaves and one link a chain."""

from __future__ import annotations

from collections.abc import Callable, Collection

from engram.governance.v1 import governance_service_pb2 as gpb

Derive = Callable[[str, str], str]


class ChainLinks:
    def __init__(self, derive: Derive, kinds: Collection[str]) -> None:
        self._derive, self._kinds = derive, kinds
        self._named: set[str] = set()
        """The leaves of ``kinds`` the bundle's erasures list."""
        self._leaves: dict[str, str] = {}
        """Those of them the bundle holds -> the leaf after re-addressing."""
        self._last: dict[str, tuple[int, str]] = {}
        """Chain -> position and new link of the item rewritten last."""

    def note_erasure(self, erasure: gpb.Erasure) -> None:
        """First, for each erasure of the bundle: which leaves to map."""
        self._named.update(item.leaf_hash for item in erasure.items if item.kind in self._kinds)

    def lists(self, leaf: str) -> bool:
        """Whether an erasure of the bundle lists ``leaf``."""
        return leaf in self._named

    def prev(self, chain_id: str, position: int, stored: str) -> str:
        """The link the item at ``position`` follows: its predecessor's new one, when this
        pass rewrote it just before."""
        last = self._last.get(chain_id)
        return last[1] if last is not None and last[0] == position - 1 else stored

    def linked(self, chain_id: str, position: int, link: str) -> None:
        self._last[chain_id] = (position, link)

    def planned(self, old: str, new: str) -> None:
        """While planning: an item's leaf before and after (kept when an erasure lists it)."""
        if old in self._named:
            self._leaves[old] = new

    def end_pass(self) -> None:
        """The import's own pass links again from each chain's start."""
        self._last.clear()

    def leaf(self, old: str, *, kept: Collection[str] = ()) -> str:
        """An erasure's leaf renamed: mapped if the bundle holds it, else (erased whole, or
        gone) derived under the key, unless it is one of ``kept``."""
        if old in self._leaves:
            return self._leaves[old]
        return old if old in kept else self._derive("hash", old)
