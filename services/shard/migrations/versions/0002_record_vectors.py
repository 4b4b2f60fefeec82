"""record vectors: one embedding per record, stored beside it

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # float32 little-endian bytes: portable across SQLite and Postgres (no pgvector here).
    op.create_table(
        "record_vectors",
        sa.Column("record_id", sa.String(length=32), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("record_seq", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["record_id"], ["records.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("record_id"),
    )
    with op.batch_alter_table("record_vectors", schema=None) as batch_op:
        batch_op.create_index("ix_record_vectors_seq", ["record_seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("record_vectors", schema=None) as batch_op:
        batch_op.drop_index("ix_record_vectors_seq")
    op.drop_table("record_vectors")
