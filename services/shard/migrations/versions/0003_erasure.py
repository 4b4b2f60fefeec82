"""erasure: format-2 records (salt, body commitment), write keys, fleet secrets, tombstones

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25

Existing records stay format 1 (their ids and record_hashes are referenced by snapshots,
links and governance's chain; docs/erasure.md "Data written before v2").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("format", sa.Integer(), nullable=False,
                                      server_default="1"))
        batch_op.add_column(sa.Column("salt", sa.String(length=64), nullable=False,
                                      server_default=""))
        batch_op.add_column(sa.Column("body_commitment", sa.String(length=64), nullable=False,
                                      server_default=""))
    op.create_table(
        "fleet_secrets",
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("secret", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("fleet_id"),
    )
    op.create_table(
        "write_keys",
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("record_id", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "key"),
    )
    with op.batch_alter_table("write_keys", schema=None) as batch_op:
        batch_op.create_index("ix_write_keys_record", ["record_id"], unique=False)
    op.create_table(
        "record_tombstones",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("format", sa.Integer(), nullable=False),
        sa.Column("body_commitment", sa.String(length=64), nullable=False),
        sa.Column("record_hash", sa.String(length=64), nullable=False),
        sa.Column("domain", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("importance", sa.Float(), nullable=False),
        sa.Column("cross_refs_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("gate_decision_id", sa.String(length=64), nullable=False),
        sa.Column("erasure_id", sa.String(length=64), nullable=False),
        sa.Column("erased_us", sa.BigInteger(), nullable=False),
        sa.Column("erased_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("record_tombstones", schema=None) as batch_op:
        batch_op.create_index("ix_record_tombstones_fleet_seq", ["fleet_id", "seq"],
                              unique=False)
        batch_op.create_index("ix_record_tombstones_erasure", ["erasure_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("record_tombstones", schema=None) as batch_op:
        batch_op.drop_index("ix_record_tombstones_erasure")
        batch_op.drop_index("ix_record_tombstones_fleet_seq")
    op.drop_table("record_tombstones")
    with op.batch_alter_table("write_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_write_keys_record")
    op.drop_table("write_keys")
    op.drop_table("fleet_secrets")
    with op.batch_alter_table("records", schema=None) as batch_op:
        batch_op.drop_column("body_commitment")
        batch_op.drop_column("salt")
        batch_op.drop_column("format")
