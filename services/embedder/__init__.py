"""The embedding service: one encoder several shard replicas share (docs/embedder.md)."""
