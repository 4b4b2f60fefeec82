"""Shard settings (``ENGRAM_SHARD_*``). Holds no governance database URL or path, by design."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from engram.client import TlsFiles
from services.common.settings import GovernanceClientSettings

QUALITY_LEXICAL_WEIGHT = 0.4
"""Hybrid fusion's lexical share with the quality profile: recall@10 0.853 on LoCoMo against
0.847 at 0.5 (docs/retrieval.md)."""


class ShardSettings(GovernanceClientSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_SHARD_", frozen=True, extra="ignore", populate_by_name=True
    )

    port: int = 50051
    db_url: str | None = None
    """Default: sqlite under $ENGRAM_HOME/shard/shard.db."""
    governance_addr: str | None = None
    """host:port of the governance service, whose gate decides every write."""
    allow_ungated: bool = False
    """No governance (no gate, no trust ranking): for isolated tests and benchmarks only."""
    service_token_file: Path | None = None
    """Bearer token (role "service") this process presents to governance."""
    migrate: bool = True
    rate_limit_records: float = Field(
        default=1000.0, ge=0, allow_inf_nan=False,
        description="records a second one agent may write (CreateRecord, BatchCreateRecords, "
        "ImportRecords; token bucket, a record a token): the write rate counts calls, and "
        "100 calls of 1,000 records each passed it. 0 turns the limit off; over it: "
        "RESOURCE_EXHAUSTED (RATE_LIMITED, metadata kind records, with RetryInfo), nothing "
        "of the call stored",
    )
    rate_limit_record_burst: int | None = Field(
        default=None, ge=1,
        description="records one agent may write at once; at least ENGRAM_LIMITS_BATCH_ITEMS "
        "(a full batch always fits in an idle bucket). Default: twice rate_limit_records, "
        "and never less than the batch limit",
    )
    embedder: str = "minilm"
    """Embedding provider for semantic search: minilm (the packaged all-MiniLM-L6-v2 on ONNX
    Runtime, int8: mean cosine 0.993 to the float model, LoCoMo recall unchanged), minilm-fp32
    (the same graph in float32, vectors equal to the numpy reference to 1e-6), mpnet
    (all-mpnet-base-v2 after `make mpnet`: better vectors at ~8x MiniLM's cost), hash, none, or
    the path of a sentence-transformers model directory (BERT family: config.json,
    model.safetensors, tokenizer.json, 1_Pooling/config.json) an operator mounts, such as
    BGE, E5 or GTE; the shard refuses to start when a file is missing or malformed. Two or
    three of these joined by ``+`` are one model whose vectors are theirs side by side (cosine:
    the mean of theirs): ``quality`` is ``minilm+mpnet``, the quality profile
    (docs/retrieval.md: better recall, every record and query embedded by both)."""
    previous_embedder: str = ""
    """While the records are re-embedded after a change of ``embedder``: the model they were
    embedded with (the same forms: minilm, minilm-fp32, mpnet, a directory, or a join). Its stored
    vectors then rank the records the new model has not reached yet (each query is embedded
    by both models), so semantic recall holds through the re-embedding; once it ends (or
    when no vector of that model is stored) the model is let go. Empty: only the new model's
    vectors are served, and semantic search covers the re-embedded records alone meanwhile."""
    embed_int8: bool = True
    """A model directory's encoder in int8 (dynamic quantization, ~2x faster) or float32."""
    embed_threads: int = 2
    """Batches the embedder runs at once, one core each (int8: ~180 texts/s per thread). A
    query embeds in its caller's thread; set 1 to leave a core to the write path while the
    indexer catches up."""
    embed_process: bool = True
    """Run minilm / minilm-fp32 in a child process (queries and indexing over pipes): the
    model's Python work then never holds the request threads' interpreter lock (64 writes in
    flight while indexing: ~710/s in-process, ~840/s with the child). false: in-process."""
    index_niceness: int = 10
    """How much lower (Linux nice) the background indexer and the embedder's pool run than
    request handling: under load writes and searches get the CPU first and indexing takes
    what they leave (it still gets every idle core). 0 runs them at the same priority."""
    allow_test_embedder: bool = False
    embedder_addr: str | None = None
    """host:port of a shared embedding service (``python -m services.embedder``,
    docs/embedder.md): set, this shard runs no encoder of its own (``embedder`` and its
    int8 / threads / process settings do not apply) and embeds through the service, with
    ``service_token_file`` (whose aud must name embedder); the stored vectors' model is the
    service's. The service down: indexing waits and retries, hybrid searches rank lexically."""
    embedder_tls_ca: Path | None = None
    """CA that signed the embedding service's certificate; set, the shard calls it over TLS."""
    embedder_tls_cert: Path | None = None
    """This shard's client certificate, for an embedding service that requires mutual TLS."""
    embedder_tls_key: Path | None = None
    """The private key of ``embedder_tls_cert``."""
    embedder_timeout_seconds: float = 30.0
    """How long an indexing batch keeps trying the embedding service (UNAVAILABLE answers
    are retried, backing off to 1 s) before the indexer puts it back for a later round."""
    embedder_query_timeout_seconds: float = 2.0
    """The deadline of a query's (or a semantic duplicate check's) embedding, two tries;
    past it a hybrid search ranks lexically and a semantic one fails UNAVAILABLE."""
    embedder_start_timeout_seconds: float = 120.0
    """How long the shard waits at start for the embedding service to say which model it
    runs; past it the shard does not start (exit 2)."""
    """The hash embedder is meaningless; the shard refuses it unless this says it is a test."""

    index_snapshot: bool = True
    """Save the lexical search index to a file in the data directory (on stop, as it grows)
    and load it at start, reading only the records committed since (a restart at 1M records
    then takes seconds, not minutes). false: rebuild from the records at every start."""
    index_snapshot_path: Path | None = None
    """Default: $ENGRAM_HOME/shard/lexical-index.snapshot (one per replica: it is local)."""

    lexical_weight: float | None = Field(default=None, ge=0.0, le=1.0)
    """Hybrid search: the lexical ranking's share of the fused score (the semantic ranking
    gets the rest). Default: 0.4 with the quality profile (``embedder=quality``), 0.5 with
    anything else, the best measured for each (docs/retrieval.md). A change rebuilds the
    lexical index snapshot once."""

    def hybrid_lexical_weight(self) -> float:
        if self.lexical_weight is not None:
            return self.lexical_weight
        return QUALITY_LEXICAL_WEIGHT if self.embedder == "quality" else 0.5

    dedup: Literal["off", "exact", "semantic"] = "exact"
    """Duplicate memories in a fleet: off, exact (same normalised text; free) or semantic
    (also cosine >= dedup_similarity; embeds each write synchronously, ~2-3 ms a record)."""
    dedup_similarity: float = 0.97
    filter_max_metadata: int = 16
    """Metadata key = value pairs one ListRecords / SearchRecords filter may name."""

    @model_validator(mode="after")
    def _burst_holds_a_batch(self) -> ShardSettings:
        burst, batch = self.rate_limit_record_burst, self.limits.batch_items
        if burst is not None and burst < batch:
            raise ValueError(
                f"rate_limit_record_burst ({burst}) is below ENGRAM_LIMITS_BATCH_ITEMS "
                f"({batch}): a full batch would never be admitted; set it to {batch} or more")
        return self

    def record_burst(self) -> int:
        """``rate_limit_record_burst``, or twice the rate and at least the batch limit."""
        if self.rate_limit_record_burst is not None:
            return self.rate_limit_record_burst
        return max(math.ceil(2 * self.rate_limit_records), self.limits.batch_items)


    def embedder_tls(self) -> TlsFiles:
        return TlsFiles(tls_ca=self.embedder_tls_ca, tls_cert=self.embedder_tls_cert,
                        tls_key=self.embedder_tls_key)

    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{(self.data_dir('shard') / 'shard.db').resolve()}"
