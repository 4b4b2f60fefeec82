"""Alembic environment for the artifacts store; the connection comes from Database.upgrade."""

from __future__ import annotations

from alembic import context

from services.artifacts.tables import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run artifacts migrations through services.common.db.Database.upgrade")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,
    version_table="alembic_version_artifacts",
)
with context.begin_transaction():
    context.run_migrations()
