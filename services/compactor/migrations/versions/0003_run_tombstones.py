"""run tombstones: what stays of an iteration log erased by engram forget --run

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "compactor_run_tombstones",
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("last_iter", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.String(length=64), nullable=False),
        sa.Column("erasure_id", sa.String(length=64), nullable=False),
        sa.Column("erased_us", sa.BigInteger(), nullable=False),
        sa.Column("erased_by", sa.String(length=128), nullable=False),
        sa.Column("blobs_left", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "run_id"),
    )


def downgrade() -> None:
    op.drop_table("compactor_run_tombstones")
