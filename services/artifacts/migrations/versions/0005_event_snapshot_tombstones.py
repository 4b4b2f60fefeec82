"""tombstones of single events and snapshots of a kept run (docs/erasure.md)

Events and snapshots gain ``erasure_id``, ``erased_us`` and ``erased_by``. Erasing a format-2
event in place keeps its row, seq, structural fields, ``prev_hash``, ``hash`` and
``payload_commitment`` and empties ``payload_json`` and ``salt``; a snapshot keeps its
``state_hash`` and loses its state and salt. Every row stored before is not erased
(``erasure_id`` empty).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TABLES = ("events", "snapshots")


def upgrade() -> None:
    for name in _TABLES:
        with op.batch_alter_table(name) as table:
            table.add_column(sa.Column("erasure_id", sa.String(length=64), nullable=False,
                                       server_default=""))
            table.add_column(sa.Column("erased_us", sa.BigInteger(), nullable=False,
                                       server_default="0"))
            table.add_column(sa.Column("erased_by", sa.String(length=128), nullable=False,
                                       server_default=""))


def downgrade() -> None:
    for name in reversed(_TABLES):
        with op.batch_alter_table(name) as table:
            table.drop_column("erased_by")
            table.drop_column("erased_us")
            table.drop_column("erasure_id")
