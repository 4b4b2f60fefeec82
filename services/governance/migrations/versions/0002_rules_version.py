"""rules_version on the chain head: replicas' rule caches are versioned through the database

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 14:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("witness_head", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rules_version", sa.BigInteger(), nullable=False,
                                      server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("witness_head", schema=None) as batch_op:
        batch_op.drop_column("rules_version")
