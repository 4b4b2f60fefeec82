"""The artifacts service: blobs behind pointers, event log, snapshots, evidence (seed 004)."""
