"""Artifacts domain: entities, validation, hash chain and stop semantics (no grpc, no SQL)."""
