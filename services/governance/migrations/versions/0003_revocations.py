"""revoked tokens, revoked agents and the access restrictions' version

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 10:30:00.000000
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
        "revoked_tokens",
        sa.Column("jti", sa.String(length=128), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_by", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("chain_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("jti"),
    )
    with op.batch_alter_table("revoked_tokens", schema=None) as batch_op:
        batch_op.create_index("ix_revoked_tokens_expires_ms", ["expires_ms"], unique=False)
    op.create_table(
        "revoked_agents",
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("revoked_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_by", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("chain_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "agent_id"),
    )
    access_head = op.create_table(
        "access_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # Version 1, never 0: a service holding nothing (since_version 0) always gets the set.
    op.bulk_insert(access_head, [{"id": 1, "version": 1}])


def downgrade() -> None:
    op.drop_table("access_head")
    with op.batch_alter_table("revoked_tokens", schema=None) as batch_op:
        batch_op.drop_index("ix_revoked_tokens_expires_ms")
    op.drop_table("revoked_tokens")
    op.drop_table("revoked_agents")
