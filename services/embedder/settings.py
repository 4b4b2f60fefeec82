"""Embedder settings: ``ENGRAM_EMBEDDER_*`` (plus the shared ``ENGRAM_HOME``, limits …)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import GovernanceClientSettings


class EmbedderSettings(GovernanceClientSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_EMBEDDER_", frozen=True, extra="ignore", populate_by_name=True
    )

    port: int = 50055
    embedder: str = Field(
        default="minilm",
        description="the encoder, named as ENGRAM_SHARD_EMBEDDER names it: minilm (the "
        "packaged all-MiniLM-L6-v2, int8), minilm-fp32, mpnet (after `make mpnet`) or the path "
        "of a sentence-transformers model directory, or two or three of these joined by + "
        "(quality: minilm+mpnet); hash only with allow_test_embedder")
    int8: bool = Field(
        default=True, description="mpnet or a model directory in int8 (dynamic quantization, "
        "~2x faster) or float32; minilm / minilm-fp32 say it themselves")
    threads: int = Field(
        default=2, ge=1, description="batches the encoder runs at once, one core each")
    background_niceness: int = Field(
        default=10, ge=0, description="how much lower (Linux nice) indexing batches "
        "(background=true) run than queries")
    allow_test_embedder: bool = Field(
        default=False, description="serve the meaningless hash embedder (tests only)")
    rate_limit_reads: float = Field(
        default=0.0, ge=0,
        description="Embed / Describe calls a second one caller may make; 0 (the default) "
        "turns the limit off: the only caller is the shards' service principal, whose "
        "replicas share one agent id, and max_concurrent_rpcs bounds the load")
    governance_addr: str | None = Field(
        default=None, description="host:port of governance, polled for revoked tokens and "
        "suspended agents (with service_token_file), as the other services poll it; unset: a "
        "revoked shard service token is refused only when it expires (a warning says so)")
    service_token_file: Path | None = Field(
        default=None, description="bearer token (role service, agent svc-embedder, fleet "
        "system, aud governance) this process presents to governance")

