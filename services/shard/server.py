"""Assemble the shard server: store, gate, trust, servicer, shared runtime."""

from __future__ import annotations

import threading
from pathlib import Path

from services.common.access import governance_restrictions
from services.common.admission import RecordRate
from services.common.db import Database
from services.common.pagination import PageTokens
from services.common.server import EngramServer, ServiceSpec, build_server
from services.shard.compaction import MemoryCompactor
from services.shard.erasure import RecordEraser
from services.shard.governance_gate import GovernanceGate
from services.shard.metrics import ShardMetrics
from services.shard.ports import TrustSource, WriteGate
from services.shard.retrieval.embedding import (
    EmbeddingProvider,
    HashEmbedder,
    require_production,
)
from services.shard.retrieval.embedding_concat import build_embedder
from services.shard.retrieval.encoder_choice import encoder_spec
from services.shard.retrieval.model_dir import ModelSpec
from services.shard.search.fleet_index import ContextSettings
from services.shard.search.index import SearchIndex
from services.shard.service import ShardService
from services.shard.servicer import (
    KINDS,
    POLICY,
    RECORDS,
    SERVICE_NAME,
    FilterLimits,
    ShardServicer,
    add_to_server,
)
from services.shard.settings import ShardSettings

MIGRATIONS = Path(__file__).parent / "migrations"


def embedder_spec(settings: ShardSettings) -> tuple[ModelSpec, bool] | None:
    """The encoder ``settings.embedder`` names and whether it runs int8, or None for the
    hash and no embedder (:func:`encoder_spec`)."""
    return encoder_spec(settings.embedder, settings.home, settings.embed_int8,
                        "ENGRAM_SHARD_EMBEDDER")


def embedding_provider(settings: ShardSettings) -> EmbeddingProvider | None:
    """The provider for ``settings.embedder`` (None for "none"); refuses test-only ones. Names
    joined by ``+`` (and the ``quality`` profile) are one :class:`ConcatEmbedder`."""
    if settings.embedder_addr:
        return _remote_provider(settings)
    if settings.embedder == "none":
        return None
    provider = build_embedder(
        settings.embedder, "ENGRAM_SHARD_EMBEDDER",
        lambda name: _encoder(settings.model_copy(update={"embedder": name})))
    try:
        require_production(provider, allow_test_embedder=settings.allow_test_embedder)
    except BaseException:
        provider.close()
        raise
    return provider


def _encoder(settings: ShardSettings) -> EmbeddingProvider:
    """The one encoder ``settings.embedder`` names."""
    provider: EmbeddingProvider
    chosen = embedder_spec(settings)
    if chosen is None:
        return HashEmbedder()
    spec, int8 = chosen
    if settings.embed_process:
        from services.shard.retrieval.embedding_process import ProcessEmbedder

        provider = ProcessEmbedder(spec, threads=settings.embed_threads, int8=int8,
                                   niceness=settings.index_niceness,
                                   log_level=settings.log_level)
    else:
        # Imported here: a lexical-only or test shard never loads ONNX Runtime.
        from services.shard.retrieval.embedding_onnx import onnx_encoder

        provider = onnx_encoder(spec, threads=settings.embed_threads, int8=int8,
                                pool_niceness=settings.index_niceness, build_apart=True)
    return provider


def _remote_provider(settings: ShardSettings) -> EmbeddingProvider:
    """The shared embedding service ENGRAM_SHARD_EMBEDDER_ADDR names (its model, its
    vectors); a service that does not answer within the start timeout stops the start."""
    from services.shard.retrieval.embedding_remote import remote_embedder

    assert settings.embedder_addr
    return remote_embedder(
        settings.embedder_addr, settings.service_token_file, tls=settings.embedder_tls(),
        timeout=settings.embedder_timeout_seconds,
        query_timeout=settings.embedder_query_timeout_seconds,
        max_texts=settings.limits.batch_items,
        start_timeout=settings.embedder_start_timeout_seconds)


def build_shard_server(
    settings: ShardSettings,
    *,
    gate: WriteGate | None = None,
    trust: TrustSource | None = None,
    database: Database | None = None,
) -> tuple[EngramServer, ShardService]:
    if gate is None and not settings.allow_ungated:
        raise ValueError(
            "every shard write must pass the governance gate: pass gate=, or set "
            "allow_ungated (ENGRAM_SHARD_ALLOW_UNGATED=true) for an isolated test or benchmark"
        )
    provider = embedding_provider(settings)  # refuse a test embedder before touching the store
    database = database or Database(settings.database_url(),
                                    **settings.database_options())
    database.prepare_schema(MIGRATIONS, "shard", migrate=settings.migrate)
    # The in-memory index serves every search mode; without a provider it is lexical only.
    snapshot = None
    if settings.index_snapshot:
        snapshot = settings.index_snapshot_path or (
            settings.data_dir("shard") / "lexical-index.snapshot")
    previous = None
    if settings.previous_embedder and provider is not None:
        previous = embedding_provider(settings.model_copy(
            update={"embedder": settings.previous_embedder, "embedder_addr": None}))
    index = SearchIndex(database, provider, niceness=settings.index_niceness,
                        context=ContextSettings(lexical_weight=settings.hybrid_lexical_weight()),
                        snapshot_path=snapshot, previous=previous)
    service = ShardService(database, gate=gate, trust=trust, index=index,
                           dedup=settings.dedup, dedup_similarity=settings.dedup_similarity,
                           limits=settings.limits)

    def warm_up(stopping: threading.Event) -> None:
        """A search finds every stored record, and a write reaches governance."""
        index.sync()
        if isinstance(gate, GovernanceGate):
            gate.wait_connected(stopping)

    def stop() -> None:
        index.stop()
        if provider is not None:
            provider.close()  # the embedder's child process, if it runs in one
        if index.previous is not None:  # a re-embedding still going on
            index.previous.close()
        database.dispose()

    eraser = RecordEraser(service, gate if isinstance(gate, GovernanceGate) else None)
    servicer = ShardServicer(service, MemoryCompactor(service),
                             PageTokens.for_service(settings, "shard"),
                             FilterLimits(settings.filter_max_metadata), eraser)
    restrictions = governance_restrictions(
        "shard", settings.governance_addr, settings.service_token_file,
        settings.governance_tls(), settings.auth_restrictions_refresh_seconds)
    spec = ServiceSpec(
        name="shard",
        full_names=[SERVICE_NAME],
        register=lambda server: add_to_server(servicer, server),
        policy=POLICY,
        kinds=KINDS,
        on_start=index.start,
        warm_up=warm_up,
        on_stop=stop,
        ready=lambda: index.ready,
        restrictions=restrictions,
        probe=database.ping,
        record_counts=RECORDS,
        record_rate=_record_rate(settings),
    )
    spec.registry.register(ShardMetrics(service, index))
    return build_server(settings, spec), service


def _record_rate(settings: ShardSettings) -> RecordRate | None:
    """Records a second one agent may write; None when ENGRAM_SHARD_RATE_LIMIT_RECORDS is 0."""
    if settings.rate_limit_records <= 0:
        return None
    prefix = str(settings.model_config.get("env_prefix", "ENGRAM_SHARD_")).upper()
    return RecordRate(settings.rate_limit_records, settings.record_burst(),
                      f"{prefix}RATE_LIMIT_RECORDS, {prefix}RATE_LIMIT_RECORD_BURST")
