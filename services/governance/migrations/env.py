"""Alembic environment for the governance store; the connection comes from Database.upgrade."""

from __future__ import annotations

from alembic import context

from services.governance.tables import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run governance migrations through services.common.db.Database.upgrade")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,
    version_table="alembic_version_governance",
)
with context.begin_transaction():
    context.run_migrations()
