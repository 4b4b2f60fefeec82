"""Governance domain logic: tiers and trust, rules and the judge, contradictions, deny patterns,
decisions, the witness chain and its replay.

Nothing here imports grpc or SQLAlchemy.
"""
