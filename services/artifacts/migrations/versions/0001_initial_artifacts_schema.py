"""Initial artifacts schema: runs, artifacts (pointers), events, snapshots, evidence, manifests.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("fleet_id", sa.String(128), nullable=False),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("stopped_us", sa.BigInteger(), nullable=False),
        sa.Column("event_count", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("latest_snapshot_id", sa.String(64), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=False),
    )
    op.create_index("ix_runs_fleet_created", "runs", ["fleet_id", "created_us", "run_id"])
    op.create_table(
        "artifacts",
        sa.Column("artifact_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step_id", sa.String(128), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False, unique=True),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("mime_type", sa.String(255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=False),
    )
    op.create_index("ix_artifacts_run_step", "artifacts", ["run_id", "step_id"])
    op.create_index("ix_artifacts_hash", "artifacts", ["hash"])
    op.create_table(
        "events",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("type", sa.String(128), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("manifest_id", sa.String(64), nullable=False),
        sa.Column("artifact_ids_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.UniqueConstraint("run_id", "request_id", name="uq_events_run_request"),
    )
    op.create_table(
        "snapshots",
        sa.Column("snapshot_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("state_hash", sa.String(64), nullable=False),
        sa.Column("manifest_id", sa.String(64), nullable=False),
        sa.Column("artifact_ids_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_snapshots_run_created", "snapshots",
                    ["run_id", "created_us", "snapshot_id"])
    op.create_table(
        "evidence",
        sa.Column("fleet_id", sa.String(128), primary_key=True),
        sa.Column("evidence_id", sa.String(64), primary_key=True),
        sa.Column("corpus_id", sa.String(128), nullable=False),
        sa.Column("index_id", sa.String(128), nullable=False),
        sa.Column("chunk_id", sa.String(128), nullable=False),
        sa.Column("span_start", sa.BigInteger(), nullable=False),
        sa.Column("span_end", sa.BigInteger(), nullable=False),
        sa.Column("artifact_id", sa.String(64), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_evidence_namespace", "evidence",
                    ["fleet_id", "corpus_id", "index_id", "evidence_id"])
    op.create_table(
        "manifests",
        sa.Column("fleet_id", sa.String(128), primary_key=True),
        sa.Column("manifest_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("content_json", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_manifests_fleet_run", "manifests", ["fleet_id", "run_id", "manifest_id"])


def downgrade() -> None:
    for table in ("manifests", "evidence", "snapshots", "events", "artifacts", "runs"):
        op.drop_table(table)
