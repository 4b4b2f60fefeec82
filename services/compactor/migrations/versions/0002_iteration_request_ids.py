"""RecordIteration request ids (idempotent retries of iteration 0, "next")

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('compactor_iteration_requests',
    sa.Column('fleet_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('request_id', sa.String(length=128), nullable=False),
    sa.Column('iteration', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('fleet_id', 'run_id', 'request_id')
    )


def downgrade() -> None:
    op.drop_table('compactor_iteration_requests')
