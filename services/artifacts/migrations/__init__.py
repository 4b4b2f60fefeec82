"""Alembic migrations of the artifacts store, shipped with the package."""
