"""The compactor service: tiered iteration logs (seed 003) and memory-compaction policy runs."""
