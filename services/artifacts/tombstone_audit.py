"""VerifyArtifacts' audit of tombstones (docs/erasure.md): every event and snapshot erased in
place must be listed, under the hash it kept, by the erasure it names, as governance recorded it
for this fleet.

The chain check (ReplayEvents, Rehydrate, every snapshot read) sees only a tombstone's form: a
tombstone keeps its link, so anyone able to write the database could blank an item's content,
name an erasure and leave a chain that still verifies. Only governance knows which items an
erasure listed, so the audit asks it (GetErasure, once per erasure id within the call, through
the service's ErasureSource). Reads do not: they would depend on governance for every replay.

When governance cannot be asked (unreachable, or no governance address), the tombstones whose
erasure was not read are counted unconfirmed, not failed and not passed: the call still reports
everything else.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.artifacts.domain.entities import StoredTombstone, TombstoneProblem
from services.common.erasure_source import ErasureSource
from services.common.errors import EngramError, NotFound

log = logging.getLogger("engram.artifacts")

NOT_IN_ERASURE = "TOMBSTONE_NOT_IN_ERASURE"
INVALID = "INVALID_TOMBSTONE"


@dataclass
class TombstoneAudit:
    events: int = 0
    """Events checked that are erased in place."""
    snapshots: int = 0
    """Snapshots checked that are erased in place (and well formed: a malformed snapshot
    tombstone is a SNAPSHOT_HASH_MISMATCH of its own)."""
    unconfirmed: int = 0
    """Tombstones whose erasure governance could not be asked about."""
    problems: list[TombstoneProblem] = field(default_factory=list)


class ErasureLookup:
    """The items each erasure of ``fleet_id`` lists, read from governance once per erasure id;
    after governance failed to answer once, nothing more is asked in this call."""

    def __init__(self, source: ErasureSource | None, fleet_id: str) -> None:
        self._source = source
        self._fleet_id = fleet_id
        self._orders: dict[str, frozenset[tuple[str, str, str]]] = {}
        self.down = "no governance address" if source is None else ""

    def items(self, erasure_id: str) -> frozenset[tuple[str, str, str]] | None:
        """What ``erasure_id`` lists for this fleet (empty: governance has no such erasure of
        this fleet); None when governance could not be asked."""
        if erasure_id in self._orders:
            return self._orders[erasure_id]
        if self.down or self._source is None:
            return None
        try:
            order = self._source.erasure(erasure_id)
            listed = frozenset(order.items) if order.fleet_id == self._fleet_id else frozenset()
        except NotFound:
            listed = frozenset()
        except EngramError as error:  # unavailable, refused, timed out: not an answer
            self.down = f"{error.reason or type(error).__name__}: {error}"
            log.warning("governance could not confirm tombstones' erasures",
                        extra={"fleet_id": self._fleet_id, "erasure_id": erasure_id,
                               "error": self.down})
            return None
        self._orders[erasure_id] = listed
        return listed


def audit_tombstones(tombstones: Iterable[StoredTombstone], source: ErasureSource | None,
                     fleet_id: str) -> TombstoneAudit:
    """Check each tombstone against the erasure it names (see the module's docstring)."""
    audit = TombstoneAudit()
    lookup = ErasureLookup(source, fleet_id)
    for tombstone in tombstones:
        if tombstone.kind == "snapshot":
            if not tombstone.well_formed:
                continue  # reported among the snapshot problems (SNAPSHOT_HASH_MISMATCH)
            audit.snapshots += 1
        else:
            audit.events += 1
        problem = ""
        if not tombstone.well_formed:
            problem = INVALID
        else:
            listed = lookup.items(tombstone.erasure_id)
            if listed is None:
                audit.unconfirmed += 1
            elif (tombstone.kind, tombstone.id, tombstone.leaf_hash) not in listed:
                problem = NOT_IN_ERASURE
        if problem:
            found = TombstoneProblem(tombstone.kind, tombstone.id, tombstone.run_id,
                                     tombstone.erasure_id, problem, tombstone.leaf_hash)
            log.warning("tombstone integrity problem", extra=found.__dict__)
            audit.problems.append(found)
    if audit.unconfirmed:
        log.warning("tombstones left unconfirmed", extra={
            "fleet_id": fleet_id, "unconfirmed": audit.unconfirmed, "error": lookup.down})
    return audit
