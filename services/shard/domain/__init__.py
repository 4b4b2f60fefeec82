"""Shard domain logic: records, domains and routing, cross-references, scoring.

Nothing here imports grpc or SQLAlchemy.
"""
