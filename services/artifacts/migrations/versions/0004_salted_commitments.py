"""salted commitments for events and snapshots (format 2, docs/erasure.md)

Events gain ``format``, ``salt`` and ``payload_commitment``: a format-2 event's chain hash
covers the commitment, not the payload. Snapshots gain ``format`` and ``salt``: a format-2
snapshot's ``state_hash`` is the commitment of its state. Every row stored before stays
format 1 with no salt: its hashes are chained (the next event, a run's head, a run
tombstone, governance's erasure items), so none is rewritten.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as events:
        events.add_column(sa.Column("format", sa.Integer(), nullable=False, server_default="1"))
        events.add_column(sa.Column("salt", sa.String(length=64), nullable=False,
                                    server_default=""))
        events.add_column(sa.Column("payload_commitment", sa.String(length=64), nullable=False,
                                    server_default=""))
    with op.batch_alter_table("snapshots") as snapshots:
        snapshots.add_column(sa.Column("format", sa.Integer(), nullable=False,
                                       server_default="1"))
        snapshots.add_column(sa.Column("salt", sa.String(length=64), nullable=False,
                                       server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as snapshots:
        snapshots.drop_column("salt")
        snapshots.drop_column("format")
    with op.batch_alter_table("events") as events:
        events.drop_column("payload_commitment")
        events.drop_column("salt")
        events.drop_column("format")
