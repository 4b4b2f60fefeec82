"""Alembic environment for the shard store; the connection comes from Database.upgrade."""

from __future__ import annotations

from services.common.db import run_migrations
from services.shard.tables import Base

run_migrations(Base.metadata, "shard")
