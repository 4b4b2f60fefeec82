"""Shard domain logic: records, domains and routing, cross-references, scoring, compaction.

Nothing here imports grpc or SQLAlchemy.
"""
