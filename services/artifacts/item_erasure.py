"""Erasing single events and snapshots of a run that is kept (docs/erasure.md, issue 17).

An erasure's ``event`` items (id ``<run_id>:<seq>``, leaf the event's hash) and ``snapshot``
items (leaf its ``state_hash``) are tombstoned in place, all in one transaction: the row stays
with its seq, structural fields, ``prev_hash``, ``hash`` and ``payload_commitment`` (a
snapshot its ``state_hash``); ``payload_json`` (``state_json``) and ``salt`` are emptied and
``erasure_id``, ``erased_us`` and ``erased_by`` set. The run's chain still verifies: a format-2
event's link never needed its payload, only its commitment. A format-1 item (its hash is over
the content itself) is refused, ``LEGACY_EVENT``: only erasing the whole run removes it.
Every item is checked before any is changed, so a refusal leaves nothing half-done; an item
already erased (in place, or with its whole run) is counted, not erased again.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.artifacts.tables import EventRow, RunRow, RunTombstoneRow, SnapshotRow
from services.common.erasure_source import ErasureOrder, run_item_key
from services.common.errors import FailedPrecondition, NotFound

IN_PLACE_KINDS = ("event", "snapshot")


@dataclass(frozen=True)
class ErasedInPlace:
    events: int = 0
    snapshots: int = 0
    already: int = 0


def erase_in_place(session: Session, order: ErasureOrder, now_us: int) -> ErasedInPlace:
    """Tombstone the order's events and snapshots in ``session`` (the caller commits)."""
    fleet_id = order.fleet_id
    events: list[EventRow] = []
    snapshots: list[SnapshotRow] = []
    already = 0
    _lock_runs(session, order)
    for kind, item_id, leaf in order.items:
        found: EventRow | SnapshotRow
        if kind == "event":
            run_id, seq = run_item_key(item_id)
            row = session.get(EventRow, (fleet_id, run_id, seq)) if seq else None
            if row is None:
                already += _absent(session, order, run_id, f"event {item_id}", "EVENT_NOT_FOUND")
                continue
            found, stored_leaf = row, row.hash
        elif kind == "snapshot":
            row_s = session.get(SnapshotRow, item_id)
            if row_s is None or row_s.fleet_id != fleet_id:  # another fleet's: absent here
                already += _absent(session, order, "", f"snapshot {item_id}",
                                   "SNAPSHOT_NOT_FOUND")
                continue
            found, stored_leaf = row_s, row_s.state_hash
        else:
            continue
        if found.erasure_id:
            already += 1
            continue
        if stored_leaf != leaf:
            raise leaf_mismatch(order, kind, item_id, stored_leaf, leaf)
        if found.format != 2:
            raise FailedPrecondition(
                f"{kind} {item_id} is format 1 (stored before salted commitments): its hash "
                "covers its content, so it cannot be erased in place; erase the whole run "
                "(engram forget --run)", reason="LEGACY_EVENT",
                metadata={"kind": kind, "id": item_id})
        if isinstance(found, EventRow):
            events.append(found)
        else:
            snapshots.append(found)
    for event in events:
        event.payload_json, event.salt = "", ""
        _mark(event, order, now_us)
    for snapshot in snapshots:
        snapshot.state_json, snapshot.salt = "", ""
        _mark(snapshot, order, now_us)
    session.flush()
    return ErasedInPlace(len(events), len(snapshots), already)


def leaf_mismatch(order: ErasureOrder, kind: str, item_id: str, stored: str,
                  listed: str) -> FailedPrecondition:
    """The refusal of an item whose stored hash is not the leaf the erasure lists."""
    return FailedPrecondition(
        f"{kind} {item_id} has hash {stored[:16]}… but erasure {order.erasure_id} lists "
        f"{listed[:16]}…; record a new erasure", reason="ERASURE_MISMATCH",
        metadata={"kind": kind, "id": item_id})


def _mark(row: EventRow | SnapshotRow, order: ErasureOrder, now_us: int) -> None:
    row.erasure_id, row.erased_us, row.erased_by = order.erasure_id, now_us, order.requested_by


def _lock_runs(session: Session, order: ErasureOrder) -> None:
    """Hold the rows of the items' runs (Postgres; SQLite has one writer) as appends and
    imports do, in id order so two erasures never wait for each other in a cycle: nothing of
    those runs moves until the commit, and the same erasure carried out at once waits, then
    finds its items erased."""
    if session.get_bind().dialect.name != "postgresql":
        return
    fleet_id = order.fleet_id
    runs = {run_item_key(item_id)[0] for kind, item_id, _ in order.items if kind == "event"}
    snapshot_ids = [item_id for kind, item_id, _ in order.items if kind == "snapshot"]
    for start in range(0, len(snapshot_ids), 500):
        runs.update(session.scalars(select(SnapshotRow.run_id).where(
            SnapshotRow.fleet_id == fleet_id,
            SnapshotRow.snapshot_id.in_(snapshot_ids[start:start + 500]))))
    for run_id in sorted(runs):
        session.execute(select(RunRow.run_id).where(
            RunRow.fleet_id == fleet_id, RunRow.run_id == run_id).with_for_update())


def _absent(session: Session, order: ErasureOrder, run_id: str, what: str,
            reason: str) -> int:
    """1 when the item went with its whole run (erased before); an imported erasure's item
    this service never held is nothing to do (0); otherwise NOT_FOUND naming it."""
    if run_id and session.get(RunTombstoneRow, (order.fleet_id, run_id)) is not None:
        return 1
    if order.imported:
        return 0
    raise NotFound(f"{what} of erasure {order.erasure_id} is not stored in this fleet",
                   reason=reason, metadata={"erasure_id": order.erasure_id})
