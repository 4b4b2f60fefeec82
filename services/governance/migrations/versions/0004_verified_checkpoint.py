"""the last checkpoint a full chain verification found intact (a start checks from it)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 19:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "witness_verified",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("head", sa.String(length=64), nullable=False),
        sa.Column("verified_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("witness_verified")
