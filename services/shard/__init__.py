"""The shard service: immutable, content-addressed memory records (seeds 000, 001)."""
