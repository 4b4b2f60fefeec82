"""Assemble the embedding service: one encoder, loaded as the shard loads its own."""

from __future__ import annotations

from services.common.access import governance_restrictions
from services.common.server import EngramServer, ServiceSpec, build_server
from services.embedder.metrics import EmbedderMetrics, MeteredEncoder
from services.embedder.servicer import KINDS, POLICY, SERVICE_NAME, EmbedderServicer, add_to_server
from services.embedder.settings import EmbedderSettings
from services.shard.retrieval.embedding import (
    EmbeddingProvider,
    HashEmbedder,
    TestEmbedderRefused,
)
from services.shard.retrieval.embedding_concat import build_embedder
from services.shard.retrieval.encoder_choice import encoder_spec


def load_encoder(settings: EmbedderSettings) -> EmbeddingProvider:
    """The encoder ENGRAM_EMBEDDER_EMBEDDER names (the hash one only for tests); names joined
    by ``+`` (and the ``quality`` profile) are one :class:`ConcatEmbedder`, as in the shard."""
    if settings.embedder == "none":
        raise ValueError("ENGRAM_EMBEDDER_EMBEDDER=none: an embedding service needs a model")
    return build_embedder(settings.embedder, "ENGRAM_EMBEDDER_EMBEDDER",
                          lambda name: _encoder(settings, name))


def _encoder(settings: EmbedderSettings, name: str) -> EmbeddingProvider:
    chosen = encoder_spec(name, settings.home, settings.int8, "ENGRAM_EMBEDDER_EMBEDDER")
    if chosen is None:
        if not settings.allow_test_embedder:
            raise TestEmbedderRefused(
                "ENGRAM_EMBEDDER_EMBEDDER=hash is for tests only; configure a real model "
                "(minilm) or set ENGRAM_EMBEDDER_ALLOW_TEST_EMBEDDER=true in tests")
        return HashEmbedder()
    spec, int8 = chosen
    # Imported here: a test service on the hash embedder never loads ONNX Runtime.
    from services.shard.retrieval.embedding_onnx import onnx_encoder

    return onnx_encoder(spec, threads=settings.threads, int8=int8,
                        pool_niceness=settings.background_niceness, build_apart=True)


def build_embedder_server(settings: EmbedderSettings) -> EngramServer:
    # Revoked tokens and suspended agents, polled from governance as every service does; built
    # before the model is loaded, so a missing token file fails the start at once.
    restrictions = governance_restrictions(
        "embedder", settings.governance_addr, settings.service_token_file,
        settings.governance_tls(), settings.auth_restrictions_refresh_seconds)
    try:
        encoder = MeteredEncoder(load_encoder(settings))
    except BaseException:
        if restrictions is not None:
            restrictions.stop()  # never started: closes its channel to governance
        raise
    servicer = EmbedderServicer(encoder, settings.limits)
    spec = ServiceSpec(
        name="embedder",
        full_names=[SERVICE_NAME],
        register=lambda server: add_to_server(servicer, server),
        policy=POLICY,
        kinds=KINDS,
        on_stop=encoder.close,
        restrictions=restrictions,
    )
    spec.registry.register(EmbedderMetrics(encoder))
    return build_server(settings, spec)
