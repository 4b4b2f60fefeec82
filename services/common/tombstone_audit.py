"""Checking tombstones against the erasures governance recorded (docs/erasure.md), shared by
the artifacts service's VerifyArtifacts (events and snapshots erased in place) and the shard's
VerifyRecords (record tombstones).

A tombstone's form is checked where it is read; that an erasure lists it is not something the
tombstone can show: anyone able to write a service's database could blank an item, name an
erasure and leave a chain (or a record's leaf) that still verifies. Only governance knows which
items an erasure listed, so a verification asks it (GetErasure, through the service's
ErasureSource, with the service's own token), each erasure id at most once while it is cached.

When governance cannot be asked (unreachable, or no governance address), the tombstones whose
erasure was not read are counted unconfirmed, not failed and not passed: the call still reports
everything else, and asks governance nothing more.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from services.common.erasure_source import ErasureSource
from services.common.errors import EngramError, NotFound

NOT_IN_ERASURE = "TOMBSTONE_NOT_IN_ERASURE"
"""No erasure governance recorded for the fleet lists the item under the hash it kept."""
BESIDE_LIVE_LOG = "TOMBSTONE_BESIDE_LIVE_LOG"
"""An iteration log erased whole that is still recorded (its rows beside its tombstone)."""
INVALID = "INVALID_TOMBSTONE"
"""Not a tombstone's form (no erasure id of governance's form, no erase time, content left)."""
CACHED_ITEMS = 100_000
"""Items of erasures an :class:`ErasureLookup` without a service's :class:`RecordedErasures`
keeps at most (ten erasures of the most items one may list, MAX_ERASURE_ITEMS); past it the
least recently used are let go (asked again if named again), so one verification's memory
stays bounded whatever the fleet holds."""
SHARED_ITEMS = 200_000
"""Items of erasures a service's :class:`RecordedErasures` keeps at most, across calls."""


class RecordedErasures:
    """Erasures governance answered, kept across calls (a service holds one). A recorded
    erasure never changes, so what governance listed once stays true; without this, any agent
    paging VerifyRecords again and again made the shard ask governance once per erasure id on
    every page (found by review). Only found erasures are kept (a missing one may be recorded
    later); the least recently used are let go past ``max_items`` items."""

    def __init__(self, max_items: int = SHARED_ITEMS) -> None:
        self._max_items = max_items
        self._orders: OrderedDict[str, tuple[str, frozenset[tuple[str, str, str]]]] = \
            OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()

    def get(self, erasure_id: str) -> tuple[str, frozenset[tuple[str, str, str]]] | None:
        """(fleet_id, items) of an erasure governance answered before, else None."""
        with self._lock:
            found = self._orders.get(erasure_id)
            if found is not None:
                self._orders.move_to_end(erasure_id)
            return found

    def keep(self, erasure_id: str, fleet_id: str,
             items: frozenset[tuple[str, str, str]]) -> None:
        if len(items) > self._max_items:
            return
        with self._lock:
            if erasure_id in self._orders:
                return
            while self._orders and self._cached + len(items) > self._max_items:
                _, (_, oldest) = self._orders.popitem(last=False)
                self._cached -= len(oldest)
            self._orders[erasure_id] = (fleet_id, items)
            self._cached += len(items)


class ErasureLookup:
    """The items each erasure of ``fleet_id`` lists, read from governance once per erasure id
    while kept in ``recorded`` (the service's, shared by its calls; else one of this lookup's
    own, at most ``max_items`` items); after governance failed to answer once, nothing more is
    asked by this lookup. Make one per call."""

    def __init__(self, source: ErasureSource | None, fleet_id: str,
                 log: logging.Logger, max_items: int = CACHED_ITEMS,
                 recorded: RecordedErasures | None = None) -> None:
        self._source = source
        self._recorded = recorded if recorded is not None else RecordedErasures(max_items)
        self._missing: set[str] = set()
        """Ids governance has no erasure of, asked once a call (one may be recorded later)."""
        self._fleet_id = fleet_id
        self._log = log
        self.down = "no governance address" if source is None else ""

    def items(self, erasure_id: str) -> frozenset[tuple[str, str, str]] | None:
        """What ``erasure_id`` lists for this fleet as ``(kind, id, leaf_hash)`` (empty:
        governance has no such erasure of this fleet); None when governance could not be
        asked."""
        known = self._recorded.get(erasure_id)
        if known is not None:
            return known[1] if known[0] == self._fleet_id else frozenset()
        if erasure_id in self._missing:
            return frozenset()
        if self.down or self._source is None:
            return None
        try:
            order = self._source.erasure(erasure_id)
        except NotFound:
            self._missing.add(erasure_id)
            return frozenset()
        except EngramError as error:  # unavailable, refused, timed out: not an answer
            self.down = f"{error.reason or type(error).__name__}: {error}"
            self._log.warning("governance could not confirm tombstones' erasures",
                              extra={"fleet_id": self._fleet_id, "erasure_id": erasure_id,
                                     "error": self.down})
            return None
        listed = frozenset(order.items)
        self._recorded.keep(erasure_id, order.fleet_id, listed)
        return listed if order.fleet_id == self._fleet_id else frozenset()

    def lists(self, erasure_id: str, kinds: tuple[str, ...], item_id: str,
              leaf_hash: str) -> bool | None:
        """Whether ``erasure_id`` lists ``item_id`` under ``leaf_hash`` as one of ``kinds``;
        None when governance could not be asked."""
        listed = self.items(erasure_id)
        if listed is None:
            return None
        return any((kind, item_id, leaf_hash) in listed for kind in kinds)

    def report_unconfirmed(self, unconfirmed: int) -> None:
        """Log the tombstones left unconfirmed by this lookup's call, if any."""
        if unconfirmed:
            self._log.warning("tombstones left unconfirmed", extra={
                "fleet_id": self._fleet_id, "unconfirmed": unconfirmed, "error": self.down})
