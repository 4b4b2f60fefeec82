"""revoked tokens keyed by (fleet_id, jti): a revocation is its fleet's, not every fleet's

Before, the jti alone was the key: a governor of one fleet who knew another fleet's token id
could revoke it there, or record it first with an expiry already past, so that the other
fleet's own revocation of it returned the first one and never took effect.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COLUMNS = "jti, fleet_id, agent_id, expires_ms, revoked_ms, revoked_by, reason, chain_seq"


def _table(name: str, *key: str) -> None:
    op.create_table(
        name,
        sa.Column("jti", sa.String(length=128), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_by", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("chain_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(*key),
    )


def _move(key: tuple[str, ...]) -> None:
    """Copy revoked_tokens into a table keyed by ``key`` and put it in its place."""
    _table("revoked_tokens_moved", *key)
    op.execute(f"INSERT INTO revoked_tokens_moved ({_COLUMNS}) "
               f"SELECT {_COLUMNS} FROM revoked_tokens")
    op.drop_index("ix_revoked_tokens_expires_ms", table_name="revoked_tokens")
    op.drop_table("revoked_tokens")
    op.rename_table("revoked_tokens_moved", "revoked_tokens")
    op.create_index("ix_revoked_tokens_expires_ms", "revoked_tokens", ["expires_ms"])


def upgrade() -> None:
    _move(("fleet_id", "jti"))


def downgrade() -> None:
    _move(("jti",))  # fails if two fleets revoked one jti: the old key cannot hold both
