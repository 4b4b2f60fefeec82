"""keyed manifest ids and salted manifest commitments (format 2, docs/erasure.md)

Manifests gain ``format`` and ``salt``: a format-2 manifest's id is random and its
``content_hash`` the salted commitment of its content, so neither confirms a guess of the
content once the row is erased. ``manifest_keys`` maps a keyed digest of the content (HMAC
under the fleet's secret in ``fleet_secrets``) to the manifest it landed on, so creating the
same manifest again answers the first; the key goes with the manifest when it is erased.
Every manifest stored before stays format 1 (id and hash derived from the content): events
and snapshots name them by that id, so none is renamed.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("manifests") as manifests:
        manifests.add_column(sa.Column("format", sa.Integer(), nullable=False,
                                       server_default="1"))
        manifests.add_column(sa.Column("salt", sa.String(length=64), nullable=False,
                                       server_default=""))
    op.create_table(
        "manifest_keys",
        sa.Column("fleet_id", sa.String(length=128), primary_key=True),
        sa.Column("key", sa.String(length=64), primary_key=True),
        sa.Column("manifest_id", sa.String(length=64), nullable=False),
    )
    op.create_index("ix_manifest_keys_manifest", "manifest_keys", ["fleet_id", "manifest_id"])
    op.create_table(
        "fleet_secrets",
        sa.Column("fleet_id", sa.String(length=128), primary_key=True),
        sa.Column("secret", sa.String(length=64), nullable=False),
    )


def downgrade() -> None:
    # Without its salt a format-2 manifest verifies no more, and the code before this
    # revision would read it as format 1 (DATA_LOSS on every read): refuse while one is held.
    held = op.get_bind().execute(sa.text("SELECT count(*) FROM manifests WHERE format = 2"))
    if held.scalar():
        raise RuntimeError("the store holds format-2 manifests (random ids, salted "
                           "commitments) that revision 0005 cannot verify; it cannot be "
                           "downgraded past 0006 (restore a backup taken before the upgrade)")
    op.drop_table("fleet_secrets")
    op.drop_index("ix_manifest_keys_manifest", table_name="manifest_keys")
    op.drop_table("manifest_keys")
    with op.batch_alter_table("manifests") as manifests:
        manifests.drop_column("salt")
        manifests.drop_column("format")
