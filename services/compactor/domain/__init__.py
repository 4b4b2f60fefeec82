"""Compactor domain logic: warm-chain lines and hashing, blob layouts, tier and policy models.

Nothing here imports grpc or SQLAlchemy.
"""
