"""Retrieval building blocks for the shard: embeddings, text analysis, BM25, fusion, ranking."""
