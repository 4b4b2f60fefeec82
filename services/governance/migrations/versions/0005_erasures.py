"""erasures: what engram forget erased, chained before any service erases it

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "erasures",
        sa.Column("erasure_id", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("chain_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("erasure_id"),
    )
    with op.batch_alter_table("erasures", schema=None) as batch_op:
        batch_op.create_index("ix_erasures_fleet_seq", ["fleet_id", "chain_seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("erasures", schema=None) as batch_op:
        batch_op.drop_index("ix_erasures_fleet_seq")
    op.drop_table("erasures")
