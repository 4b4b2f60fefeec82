"""Runs scoped by fleet: a run is (fleet_id, run_id) in runs, events, snapshots and artifacts.

Before, ``runs.run_id`` alone was the key: a second fleet could not start a run of an id
another fleet held. Each table that names a run is rebuilt with the fleet in its key and
its rows copied over, the fleet taken from the run. SQLite cannot change a primary key in
place, so rather than a batch rebuild on one database and ALTERs naming Postgres' default
constraint names on the other, both run the same create, copy, drop and rename (what a
batch operation does on SQLite). Artifacts gain their
``name`` (from the old path, ``runs/<run>/<step>/<name>``) so a name is unique within a
fleet's run and step; their ``path`` (the blob key) is kept, so stored blobs stay where
they are and readable. Snapshots gain a ``request_id`` for idempotent retries.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_FLEET_OF_RUN = "COALESCE((SELECT r.fleet_id FROM runs r WHERE r.run_id = t.run_id), '')"
_RUN_COLUMNS = ("agent_id, status, stop_reason, created_us, stopped_us, event_count, head_hash, "
                "latest_snapshot_id, metadata_json")
_ARTIFACT_COLUMNS = ("artifact_id, run_id, step_id, path, hash, mime_type, size_bytes, "
                     "created_at, metadata")
_EVENT_COLUMNS = ("run_id, seq, type, payload_json, manifest_id, artifact_ids_json, created_us, "
                  "agent_id, prev_hash, hash, request_id")
_SNAPSHOT_COLUMNS = ("snapshot_id, run_id, seq, state_json, state_hash, manifest_id, "
                     "artifact_ids_json, created_us")


# Each primary key is named for the table it ends up in (0001's were Postgres' defaults).
def _runs_table(name: str, scoped: bool, key: str) -> None:
    columns = ["fleet_id", "run_id"] if scoped else ["run_id"]
    op.create_table(
        name,
        sa.Column("fleet_id", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("stopped_us", sa.BigInteger(), nullable=False),
        sa.Column("event_count", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("latest_snapshot_id", sa.String(64), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(*columns, name=key),
    )


def _artifacts_table(name: str, scoped: bool, key: str) -> None:
    scope = [sa.Column("fleet_id", sa.String(128), nullable=False)] if scoped else []
    named = [sa.Column("name", sa.String(512), nullable=False)] if scoped else []
    op.create_table(
        name,
        sa.Column("artifact_id", sa.String(64), nullable=False),
        *scope,
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step_id", sa.String(128), nullable=False),
        *named,
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("mime_type", sa.String(255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=False),
        sa.PrimaryKeyConstraint("artifact_id", name=key),
    )


def _events_table(name: str, scoped: bool, key: str) -> None:
    scope = [sa.Column("fleet_id", sa.String(128), nullable=False)] if scoped else []
    op.create_table(
        name,
        *scope,
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("type", sa.String(128), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("manifest_id", sa.String(64), nullable=False),
        sa.Column("artifact_ids_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.PrimaryKeyConstraint(*(["fleet_id"] if scoped else []), "run_id", "seq",
                                name=key),
    )


def _snapshots_table(name: str, scoped: bool, key: str) -> None:
    scope = [sa.Column("fleet_id", sa.String(128), nullable=False)] if scoped else []
    requests = [sa.Column("request_id", sa.String(128), nullable=True)] if scoped else []
    op.create_table(
        name,
        sa.Column("snapshot_id", sa.String(64), nullable=False),
        *scope,
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("state_hash", sa.String(64), nullable=False),
        sa.Column("manifest_id", sa.String(64), nullable=False),
        sa.Column("artifact_ids_json", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        *requests,
        sa.PrimaryKeyConstraint("snapshot_id", name=key),
    )


def _swap(table: str) -> None:
    op.drop_table(table)
    op.rename_table(f"{table}_next", table)


def upgrade() -> None:
    # Children first: their fleet comes from the old runs table.
    _artifacts_table("artifacts_next", scoped=True, key="pk_artifacts")
    op.execute(
        f"INSERT INTO artifacts_next (fleet_id, name, {_ARTIFACT_COLUMNS}) "
        f"SELECT {_FLEET_OF_RUN}, substr(t.path, length(t.run_id) + length(t.step_id) + 8), "
        f"{_prefixed(_ARTIFACT_COLUMNS)} FROM artifacts t")
    _events_table("events_next", scoped=True, key="pk_events")
    op.execute(f"INSERT INTO events_next (fleet_id, {_EVENT_COLUMNS}) "
               f"SELECT {_FLEET_OF_RUN}, {_prefixed(_EVENT_COLUMNS)} FROM events t")
    _snapshots_table("snapshots_next", scoped=True, key="pk_snapshots")
    op.execute(f"INSERT INTO snapshots_next (fleet_id, {_SNAPSHOT_COLUMNS}) "
               f"SELECT {_FLEET_OF_RUN}, {_prefixed(_SNAPSHOT_COLUMNS)} FROM snapshots t")
    _runs_table("runs_next", scoped=True, key="pk_runs")
    op.execute(f"INSERT INTO runs_next (fleet_id, run_id, {_RUN_COLUMNS}) "
               f"SELECT fleet_id, run_id, {_RUN_COLUMNS} FROM runs")
    for table in ("artifacts", "events", "snapshots", "runs"):
        _swap(table)
    op.create_index("ix_runs_fleet_created", "runs", ["fleet_id", "created_us", "run_id"])
    op.create_index("ix_artifacts_run_step", "artifacts", ["fleet_id", "run_id", "step_id"])
    op.create_index("ix_artifacts_hash", "artifacts", ["hash"])
    op.create_index("uq_artifacts_path", "artifacts", ["path"], unique=True)
    op.create_index("uq_artifacts_name", "artifacts", ["fleet_id", "run_id", "step_id", "name"],
                    unique=True)
    op.create_index("uq_events_run_request", "events", ["fleet_id", "run_id", "request_id"],
                    unique=True)
    op.create_index("ix_snapshots_run_created", "snapshots",
                    ["fleet_id", "run_id", "created_us", "snapshot_id"])
    op.create_index("uq_snapshots_run_request", "snapshots",
                    ["fleet_id", "run_id", "request_id"], unique=True)


def _prefixed(columns: str) -> str:
    return ", ".join(f"t.{c.strip()}" for c in columns.split(","))


def downgrade() -> None:
    shared = op.get_bind().execute(sa.text(
        "SELECT run_id FROM runs GROUP BY run_id HAVING COUNT(*) > 1 LIMIT 1")).first()
    if shared is not None:
        raise RuntimeError(f"run id {shared[0]!r} is used by more than one fleet; revision 0001 "
                           "keys runs by id alone and cannot hold both")
    _artifacts_table("artifacts_next", scoped=False, key="artifacts_pkey")
    op.execute(f"INSERT INTO artifacts_next ({_ARTIFACT_COLUMNS}) "
               f"SELECT {_ARTIFACT_COLUMNS} FROM artifacts")
    _events_table("events_next", scoped=False, key="events_pkey")
    op.execute(f"INSERT INTO events_next ({_EVENT_COLUMNS}) SELECT {_EVENT_COLUMNS} FROM events")
    _snapshots_table("snapshots_next", scoped=False, key="snapshots_pkey")
    op.execute(f"INSERT INTO snapshots_next ({_SNAPSHOT_COLUMNS}) "
               f"SELECT {_SNAPSHOT_COLUMNS} FROM snapshots")
    _runs_table("runs_next", scoped=False, key="runs_pkey")
    op.execute(f"INSERT INTO runs_next (fleet_id, run_id, {_RUN_COLUMNS}) "
               f"SELECT fleet_id, run_id, {_RUN_COLUMNS} FROM runs")
    for table in ("artifacts", "events", "snapshots", "runs"):
        _swap(table)
    op.create_index("ix_runs_fleet_created", "runs", ["fleet_id", "created_us", "run_id"])
    op.create_index("ix_artifacts_run_step", "artifacts", ["run_id", "step_id"])
    op.create_index("ix_artifacts_hash", "artifacts", ["hash"])
    op.create_index("uq_artifacts_path", "artifacts", ["path"], unique=True)
    op.create_index("uq_events_run_request", "events", ["run_id", "request_id"], unique=True)
    op.create_index("ix_snapshots_run_created", "snapshots",
                    ["run_id", "created_us", "snapshot_id"])
