"""The governance service: trust tiers, write rules, the mandatory write gate and its witness chain.

Runnable as ``python -m services.governance``. It is the only writer of its own
store; the shard reaches it only over gRPC (DESIGN.md section 1).
"""
