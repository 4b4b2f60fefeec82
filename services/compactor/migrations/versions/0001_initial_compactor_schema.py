"""initial compactor schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('compactor_hot',
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('iteration', sa.BigInteger(), nullable=False),
    sa.Column('line', sa.Text(), nullable=False),
    sa.Column('detail_json', sa.Text(), nullable=False),
    sa.Column('guardrails_json', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('fleet_id', 'run_id', 'iteration')
    )
    op.create_table('compactor_pins',
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('iteration', sa.BigInteger(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('snapshot_iteration', sa.BigInteger(), nullable=False),
    sa.Column('created_us', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('fleet_id', 'run_id', 'iteration')
    )
    op.create_table('compactor_policy_runs',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('dry_run', sa.Boolean(), nullable=False),
    sa.Column('trigger', sa.String(length=128), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('error', sa.Text(), nullable=False),
    sa.Column('examined', sa.BigInteger(), nullable=False),
    sa.Column('compacted', sa.BigInteger(), nullable=False),
    sa.Column('groups_json', sa.Text(), nullable=False),
    sa.Column('removed_ids_json', sa.Text(), nullable=False),
    sa.Column('importance_below', sa.Float(), nullable=False),
    sa.Column('older_than_days', sa.Float(), nullable=False),
    sa.Column('start_us', sa.BigInteger(), nullable=False),
    sa.Column('end_us', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('compactor_policy_runs', schema=None) as batch_op:
        batch_op.create_index('ix_compactor_policy_runs_fleet',
            ['fleet_id', 'start_us', 'id'], unique=False)

    op.create_table('compactor_runs',
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('last_iter', sa.BigInteger(), nullable=False),
    sa.Column('head_hash', sa.String(length=64), nullable=False),
    sa.Column('active_seq', sa.Integer(), nullable=False),
    sa.Column('active_bytes', sa.BigInteger(), nullable=False),
    sa.Column('index_version', sa.Integer(), nullable=False),
    sa.Column('pending_work', sa.Boolean(), nullable=False),
    sa.Column('created_us', sa.BigInteger(), nullable=False),
    sa.Column('updated_us', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('fleet_id', 'run_id')
    )
    with op.batch_alter_table('compactor_runs', schema=None) as batch_op:
        batch_op.create_index('ix_compactor_runs_pending', ['pending_work'], unique=False)

    op.create_table('compactor_segments',
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('sealed', sa.Boolean(), nullable=False),
    sa.Column('key', sa.String(length=512), nullable=False),
    sa.Column('first_iter', sa.BigInteger(), nullable=False),
    sa.Column('last_iter', sa.BigInteger(), nullable=False),
    sa.Column('lines', sa.Integer(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('first_prev_hash', sa.String(length=64), nullable=False),
    sa.Column('last_hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('fleet_id', 'run_id', 'seq')
    )
    op.create_table('compactor_snapshots',
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('iteration', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('key', sa.String(length=512), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('fleet_id', 'run_id', 'iteration')
    )
    with op.batch_alter_table('compactor_snapshots', schema=None) as batch_op:
        batch_op.create_index('ix_compactor_snapshots_state',
            ['fleet_id', 'run_id', 'state'], unique=False)

    op.create_table('compactor_warm_lines',
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('iteration', sa.BigInteger(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('line', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('fleet_id', 'run_id', 'iteration')
    )
    with op.batch_alter_table('compactor_warm_lines', schema=None) as batch_op:
        batch_op.create_index('ix_compactor_warm_lines_seq',
            ['fleet_id', 'run_id', 'seq'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('compactor_warm_lines', schema=None) as batch_op:
        batch_op.drop_index('ix_compactor_warm_lines_seq')

    op.drop_table('compactor_warm_lines')
    with op.batch_alter_table('compactor_snapshots', schema=None) as batch_op:
        batch_op.drop_index('ix_compactor_snapshots_state')

    op.drop_table('compactor_snapshots')
    op.drop_table('compactor_segments')
    with op.batch_alter_table('compactor_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_compactor_runs_pending')

    op.drop_table('compactor_runs')
    with op.batch_alter_table('compactor_policy_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_compactor_policy_runs_fleet')

    op.drop_table('compactor_policy_runs')
    op.drop_table('compactor_pins')
    op.drop_table('compactor_hot')

