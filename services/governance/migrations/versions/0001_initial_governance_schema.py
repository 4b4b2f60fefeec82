"""initial governance schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 13:42:30.049671
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("score", sa.Integer(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.Column("chain_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "agent_id"),
    )
    op.create_table(
        "decisions",
        sa.Column("decision_id", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("record_id", sa.String(length=128), nullable=False),
        sa.Column("content_hash", sa.String(length=128), nullable=False),
        sa.Column("allowed", sa.Boolean(), nullable=False),
        sa.Column("rule_ids_json", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("chain_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("decision_id"),
        sa.UniqueConstraint(
            "fleet_id", "agent_id", "request_id", "position", name="uq_decisions_request"
        ),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_decisions_agent_seq", ["fleet_id", "agent_id", "chain_seq"], unique=False
        )
        batch_op.create_index("ix_decisions_fleet_seq", ["fleet_id", "chain_seq"], unique=False)
        batch_op.create_index(
            "ix_decisions_rate", ["fleet_id", "agent_id", "allowed", "created_ms"], unique=False
        )

    op.create_table(
        "rules",
        sa.Column("rule_id", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("params_json", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("tiers_json", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("chain_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("rule_id"),
    )
    with op.batch_alter_table("rules", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rules_fleet_id"), ["fleet_id"], unique=False)

    op.create_table(
        "witness_chain",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("prev", sa.String(length=64), nullable=False),
        sa.Column("link", sa.String(length=64), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_table(
        "witness_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("head", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # The chain starts empty: length 0, head = 32 zero bytes (witness.GENESIS).
    op.execute("INSERT INTO witness_head (id, length, head) VALUES (1, 0, '" + "00" * 32 + "')")


def downgrade() -> None:
    op.drop_table("witness_head")
    op.drop_table("witness_chain")
    with op.batch_alter_table("rules", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rules_fleet_id"))

    op.drop_table("rules")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index("ix_decisions_rate")
        batch_op.drop_index("ix_decisions_fleet_seq")
        batch_op.drop_index("ix_decisions_agent_seq")

    op.drop_table("decisions")
    op.drop_table("agents")
