"""initial shard schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22
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
        "compactions",
        sa.Column("original_id", sa.String(length=32), nullable=False),
        sa.Column("summary_id", sa.String(length=32), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("original_hash", sa.String(length=64), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("original_id"),
    )
    with op.batch_alter_table("compactions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_compactions_fleet_summary", ["fleet_id", "summary_id"], unique=False
        )

    op.create_table(
        "domains",
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("display_name", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("keywords_json", sa.Text(), nullable=False),
        sa.Column("usage_score", sa.Float(), nullable=False),
        sa.Column("usage_ts", sa.Float(), nullable=False),
        sa.Column("record_count", sa.BigInteger(), nullable=False),
        sa.Column("updated_ts", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "name"),
    )
    op.create_table(
        "records",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("record_hash", sa.String(length=64), nullable=False),
        sa.Column("domain", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("importance", sa.Float(), nullable=False),
        sa.Column("tags_json", sa.Text(), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.Column("cross_refs_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("gate_decision_id", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    with op.batch_alter_table("records", schema=None) as batch_op:
        batch_op.create_index("ix_records_content_hash", ["content_hash"], unique=False)
        batch_op.create_index(
            "ix_records_fleet_domain_seq", ["fleet_id", "domain", "seq"], unique=False
        )
        batch_op.create_index(
            "ix_records_fleet_run_seq", ["fleet_id", "run_id", "seq"], unique=False
        )
        batch_op.create_index("ix_records_fleet_seq", ["fleet_id", "seq"], unique=False)

    op.create_table(
        "write_requests",
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("record_ids_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "agent_id", "request_id"),
    )
    op.create_table(
        "links",
        sa.Column("source_id", sa.String(length=32), nullable=False),
        sa.Column("target_kind", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["source_id"], ["records.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("source_id", "target_kind", "target"),
    )
    with op.batch_alter_table("links", schema=None) as batch_op:
        batch_op.create_index(
            "ix_links_fleet_target", ["fleet_id", "target_kind", "target"], unique=False
        )

    op.create_table(
        "record_tags",
        sa.Column("record_id", sa.String(length=32), nullable=False),
        sa.Column("tag", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["record_id"], ["records.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("record_id", "tag"),
    )
    with op.batch_alter_table("record_tags", schema=None) as batch_op:
        batch_op.create_index(
            "ix_record_tags_fleet_tag", ["fleet_id", "tag", "record_id"], unique=False
        )

    _create_full_text()


def downgrade() -> None:
    _drop_full_text()
    with op.batch_alter_table("record_tags", schema=None) as batch_op:
        batch_op.drop_index("ix_record_tags_fleet_tag")

    op.drop_table("record_tags")
    with op.batch_alter_table("links", schema=None) as batch_op:
        batch_op.drop_index("ix_links_fleet_target")

    op.drop_table("links")
    op.drop_table("write_requests")
    with op.batch_alter_table("records", schema=None) as batch_op:
        batch_op.drop_index("ix_records_fleet_seq")
        batch_op.drop_index("ix_records_fleet_run_seq")
        batch_op.drop_index("ix_records_fleet_domain_seq")
        batch_op.drop_index("ix_records_content_hash")

    op.drop_table("records")
    op.drop_table("domains")
    with op.batch_alter_table("compactions", schema=None) as batch_op:
        batch_op.drop_index("ix_compactions_fleet_summary")

    op.drop_table("compactions")


def _create_full_text() -> None:
    """SQLite: an FTS5 index over records.content kept by triggers; Postgres: tsvector + GIN."""
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "CREATE VIRTUAL TABLE records_fts USING fts5("
            "content, content='records', content_rowid='seq', tokenize='porter unicode61')"
        )
        op.execute(
            "CREATE TRIGGER records_fts_insert AFTER INSERT ON records BEGIN "
            "INSERT INTO records_fts(rowid, content) VALUES (new.seq, new.content); END"
        )
        op.execute(
            "CREATE TRIGGER records_fts_delete AFTER DELETE ON records BEGIN "
            "INSERT INTO records_fts(records_fts, rowid, content) "
            "VALUES ('delete', old.seq, old.content); END"
        )
    else:
        op.execute(
            "ALTER TABLE records ADD COLUMN content_tsv tsvector "
            "GENERATED ALWAYS AS (to_tsvector('english', content)) STORED"
        )
        op.execute("CREATE INDEX ix_records_content_tsv ON records USING GIN (content_tsv)")


def _drop_full_text() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS records_fts_delete")
        op.execute("DROP TRIGGER IF EXISTS records_fts_insert")
        op.execute("DROP TABLE IF EXISTS records_fts")
    else:
        op.execute("DROP INDEX IF EXISTS ix_records_content_tsv")
