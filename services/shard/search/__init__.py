"""Shard search: relevance from the store, then importance, recency and trust."""
