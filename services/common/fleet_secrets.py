"""A fleet's secret for keyed digests (a record's write key in the shard, a manifest's key in
artifacts): 32 random bytes made on first use and kept in the service's own ``fleet_secrets``
table. A keyed digest of content confirms no guess of it without this secret, and each such
digest is deleted with what it finds (docs/erasure.md)."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session


def fleet_secret(session: Session, table: Any, fleet_id: str) -> bytes:
    """``fleet_id``'s secret in ``table`` (a mapped class with ``fleet_id`` and ``secret``),
    made on first use; of two makers racing, the first to commit wins and both read it."""
    found = session.scalar(select(table.secret).where(table.fleet_id == fleet_id))
    if found is None:
        session.execute(text(
            f"INSERT INTO {table.__tablename__} (fleet_id, secret) VALUES (:fleet_id, :secret) "
            "ON CONFLICT DO NOTHING"), {"fleet_id": fleet_id, "secret": secrets.token_hex(32)})
        found = session.scalar(select(table.secret).where(table.fleet_id == fleet_id))
    return bytes.fromhex(str(found))
