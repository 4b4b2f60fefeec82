"""Retrieval evaluation (LoCoMo evidence recall)."""
