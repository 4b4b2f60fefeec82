"""Erased records' tombstones carried between instances (``engram export`` /
``engram import-bundle``; docs/bundle.md, docs/erasure.md).

A tombstone holds no content: an erased record's structural fields, its leaf hash
(``record_hash``) and the erasure that erased it. It is what keeps an erased record erased on
the instance a bundle moves to: ``ImportRecords`` refuses an id with a tombstone, so a bundle
made before the erasure brings nothing back. An imported tombstone is held to what an erasure
here would have left: a format-2 tombstone must re-derive its ``record_hash`` from its kept
fields, and governance here must hold the erasure it names, listing the record under that
hash (so nobody can plant a tombstone to block a record, or name an erasure that never was).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy import insert, select

from services.common.erasure_source import ErasureSource, recorded_erasure
from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
)
from services.common.limits import check_limit
from services.common.timestamps import MAX_CLOCK_SKEW_US
from services.common.tokens import Principal, validate_identifier
from services.shard.domain import crossrefs, records
from services.shard.domain.records import Tombstone
from services.shard.service import ShardService
from services.shard.tables import TombstoneRow, tombstone_values

_HEX64 = re.compile(r"[0-9a-f]{64}")


class TombstoneImports:
    """Lists a fleet's tombstones and imports another instance's."""

    def __init__(self, service: ShardService, source: ErasureSource | None) -> None:
        self.service = service
        self.source = source

    def page(self, fleet_id: str, after_id: str | None, limit: int) -> list[Tombstone]:
        """The fleet's tombstones by id, from just past ``after_id`` (a keyset page)."""
        query = select(TombstoneRow).where(TombstoneRow.fleet_id == fleet_id)
        if after_id is not None:
            query = query.where(TombstoneRow.id > after_id)
        with self.service.db.session() as session:
            rows = session.scalars(query.order_by(TombstoneRow.id).limit(limit))
            return [row.to_entity() for row in rows]

    def import_tombstones(self, principal: Principal,
                          imported: Sequence[Tombstone]) -> tuple[int, int]:
        """``(created, already present)``; all or nothing, the error naming the tombstone."""
        if not imported:
            raise InvalidArgument("no tombstones to import", reason="EMPTY_BATCH")
        limits = self.service.limits
        check_limit("an import batch", len(imported), limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS", "tombstones", reason="BATCH_TOO_LARGE")
        fleet = principal.fleet_id
        latest_us = int(self.service.clock() * 1_000_000) + MAX_CLOCK_SKEW_US
        for tombstone in imported:
            _check(tombstone, fleet, latest_us)
        listed: dict[str, set[tuple[str, str]]] = {}
        for tombstone in imported:
            if tombstone.erasure_id not in listed:
                order = recorded_erasure(self.source, "shard", tombstone.erasure_id, fleet)
                listed[tombstone.erasure_id] = {(item_id, leaf) for kind, item_id, leaf
                                                in order.items if kind in ("record", "summary")}
            if (tombstone.id, tombstone.record_hash) not in listed[tombstone.erasure_id]:
                raise FailedPrecondition(
                    f"erasure {tombstone.erasure_id} does not list record {tombstone.id} with "
                    f"record_hash {tombstone.record_hash[:16]}…; nothing was imported",
                    reason="TOMBSTONE_NOT_IN_ERASURE", metadata={"record_id": tombstone.id})
        return self._store(imported)

    def _store(self, imported: Sequence[Tombstone]) -> tuple[int, int]:
        ids = [t.id for t in imported]
        repo = self.service.repo
        with self.service.db.writing() as session:
            self.service.lock_imports(session)
            repo.lock_records(session, ids)
            live = repo.existing(session, ids)
            if live:
                first = sorted(live)[0]
                erasure = next(t.erasure_id for t in imported if t.id == first)
                raise FailedPrecondition(
                    f"record {first} is stored here; erase it first (engram forget --resume "
                    f"{erasure}), then import its tombstone; nothing was imported",
                    reason="RECORD_NOT_ERASED", metadata={"record_id": first})
            kept = {row.id: row.to_entity() for row in session.scalars(
                select(TombstoneRow).where(TombstoneRow.id.in_(ids)))}
            fresh: dict[str, Tombstone] = {}
            for tombstone in imported:
                other = kept.get(tombstone.id) or fresh.get(tombstone.id)
                if other is None:
                    fresh[tombstone.id] = tombstone
                elif (other.fleet_id, other.record_hash, other.erasure_id) != (
                        tombstone.fleet_id, tombstone.record_hash, tombstone.erasure_id):
                    # Nothing of another fleet's tombstone is said.
                    raise AlreadyExists(
                        f"record {tombstone.id} has another tombstone here; nothing was "
                        "imported", reason="TOMBSTONE_CONFLICT",
                        metadata={"record_id": tombstone.id})
            if fresh:
                # seq 0: no record of this id was ever stored here for the index to pass
                session.execute(insert(TombstoneRow),
                                [tombstone_values(t, 0) for t in fresh.values()])
        return len(fresh), len(imported) - len(fresh)


def _check(tombstone: Tombstone, fleet: str, latest_us: int) -> None:
    """INVALID_ARGUMENT (PERMISSION_DENIED for another fleet) naming what is wrong."""
    name = f"tombstone {tombstone.id[:40]!r}"
    if not records.is_record_id(tombstone.id):
        raise InvalidArgument(f"{name}: not a record id ({records.ID_HEX_LEN} lowercase "
                              "hexadecimal characters)", reason="INVALID_RECORD_ID")
    if tombstone.fleet_id != fleet:
        raise PermissionDenied(f"{name} belongs to fleet {tombstone.fleet_id!r}; this token "
                               f"imports into fleet {fleet!r} only", reason="FLEET_MISMATCH")
    if tombstone.format not in (1, 2):
        raise InvalidArgument(f"{name}: format must be 1 or 2", reason="INVALID_TOMBSTONE")
    if not _HEX64.fullmatch(tombstone.record_hash) or (
            tombstone.format == 2 and not _HEX64.fullmatch(tombstone.body_commitment)) or (
            tombstone.format == 1 and tombstone.body_commitment):
        raise InvalidArgument(f"{name}: record_hash (and, format 2, body_commitment) must be "
                              "64 lowercase hex digits", reason="INVALID_TOMBSTONE")
    for field in ("run_id", "domain", "gate_decision_id"):
        value = getattr(tombstone, field)
        if value:
            validate_identifier(field, value)
    for field in ("domain", "gate_decision_id"):  # the columns hold 64
        if len(getattr(tombstone, field)) > 64:
            raise InvalidArgument(f"{name}: {field} is longer than 64 characters",
                                  reason="INVALID_TOMBSTONE")
    validate_identifier("agent_id", tombstone.agent_id)
    validate_identifier("erasure_id", tombstone.erasure_id)
    validate_identifier("erased_by", tombstone.erased_by)
    if len(tombstone.source) > records.MAX_SOURCE_LEN or not tombstone.source.isprintable():
        raise InvalidArgument(f"{name}: source must be at most {records.MAX_SOURCE_LEN} printable "
                              "characters", reason="INVALID_TOMBSTONE")
    if not 0.0 <= tombstone.importance <= 1.0:
        raise InvalidArgument(f"{name}: importance must be within 0..1",
                              reason="INVALID_TOMBSTONE")
    crossrefs.check_count(list(tombstone.cross_refs))
    for ref in tombstone.cross_refs:
        crossrefs.CrossRef.parse(ref)
    if not 0 < tombstone.created_us <= tombstone.erased_us <= latest_us:
        raise InvalidArgument(f"{name}: it must be created after 1970, erased after it was "
                              "created, and not in the future", reason="INVALID_TOMBSTONE")
    if not records.verify_tombstone(tombstone):
        raise InvalidArgument(f"{name}: its fields do not derive its record_hash; nothing was "
                              "imported", reason="TOMBSTONE_HASH_MISMATCH",
                              metadata={"record_id": tombstone.id})
