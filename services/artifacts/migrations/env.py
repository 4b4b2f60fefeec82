"""Alembic environment for the artifacts store; the connection comes from Database.upgrade."""

from __future__ import annotations

from services.artifacts.tables import Base
from services.common.db import run_migrations

run_migrations(Base.metadata, "artifacts")
