"""VerifyArtifacts' audit of tombstones (docs/erasure.md): every event and snapshot erased in
place, and every run erased whole, must be listed, under the hash it kept, by the erasure it
names, as governance recorded it for this fleet.

The chain check (ReplayEvents, Rehydrate, every snapshot read) sees only a tombstone's form: a
tombstone keeps its link, so anyone able to write the database could blank an item's content,
name an erasure and leave a chain that still verifies. Only governance knows which items an
erasure listed, so the audit asks it (GetErasure, once per erasure id within the call, through
the service's ErasureSource: ``services.common.tombstone_audit.ErasureLookup``, which the
shard's VerifyRecords uses too). Reads do not: they would depend on governance for every replay.

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
from services.common.tombstone_audit import (
    INVALID,
    NOT_IN_ERASURE,
    ErasureLookup,
    RecordedErasures,
)

log = logging.getLogger("engram.artifacts")


@dataclass
class TombstoneAudit:
    events: int = 0
    """Events checked that are erased in place."""
    snapshots: int = 0
    """Snapshots checked that are erased in place (and well formed: a malformed snapshot
    tombstone is a SNAPSHOT_HASH_MISMATCH of its own)."""
    runs: int = 0
    """Runs checked that are erased whole (their rows deleted, a run tombstone left)."""
    unconfirmed: int = 0
    """Tombstones whose erasure governance could not be asked about."""
    problems: list[TombstoneProblem] = field(default_factory=list)


def audit_tombstones(tombstones: Iterable[StoredTombstone], source: ErasureSource | None,
                     fleet_id: str, recorded: RecordedErasures | None = None) -> TombstoneAudit:
    """Check each tombstone against the erasure it names (see the module's docstring);
    ``recorded``: the erasures governance answered before, kept across calls (the service's),
    so a caller paging verifications does not make it ask governance again each time."""
    audit = TombstoneAudit()
    lookup = ErasureLookup(source, fleet_id, log, recorded=recorded)
    for tombstone in tombstones:
        if tombstone.kind == "snapshot":
            if not tombstone.well_formed:
                continue  # reported among the snapshot problems (SNAPSHOT_HASH_MISMATCH)
            audit.snapshots += 1
        elif tombstone.kind == "run":
            audit.runs += 1
        else:
            audit.events += 1
        problem = ""
        if not tombstone.well_formed:
            problem = INVALID
        else:
            listed = lookup.lists(tombstone.erasure_id, (tombstone.kind,), tombstone.id,
                                  tombstone.leaf_hash)
            if listed is None:
                audit.unconfirmed += 1
            elif not listed:
                problem = NOT_IN_ERASURE
        if problem:
            found = TombstoneProblem(tombstone.kind, tombstone.id, tombstone.run_id,
                                     tombstone.erasure_id, problem, tombstone.leaf_hash)
            log.warning("tombstone integrity problem", extra=found.__dict__)
            audit.problems.append(found)
    lookup.report_unconfirmed(audit.unconfirmed)
    return audit
