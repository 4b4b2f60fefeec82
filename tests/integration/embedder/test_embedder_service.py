"""The shared embedding service on 127.0.0.1: shards embed through it, callers are checked,
inputs are bounded, and a shard rides out the service being down (docs/embedder.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from engram.client import EngramRpcError, ShardClient
from engram.client._channel import BaseClient
from engram.embedder.v1 import embedder_service_pb2 as pb
from engram.embedder.v1 import embedder_service_pb2_grpc as pb_grpc
from services.common.server import EngramServer
from services.common.settings import LimitsSettings
from services.common.tokens import write_token_file
from services.embedder.server import build_embedder_server
from services.embedder.settings import EmbedderSettings
from services.shard.retrieval.embedding import MINILM_NAME
from services.shard.retrieval.embedding_remote import RemoteEmbedder
from services.shard.server import build_shard_server
from services.shard.service import ShardService
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory

ServiceToken = Callable[[str], str]


def _embedder(home: Path, **settings: object) -> EngramServer:
    settings.setdefault("port", 0)
    return build_embedder_server(EmbedderSettings(home=home, **settings)).start()


def _client(address: str, token: str) -> tuple[BaseClient, pb_grpc.EmbedderServiceStub]:
    client = BaseClient(address, token, timeout=30)
    return client, pb_grpc.EmbedderServiceStub(client.channel)


def _token_file(tmp_path: Path, make_service_token: ServiceToken) -> Path:
    path = tmp_path / "shard.token"
    write_token_file(path, make_service_token("shard"))
    return path


def _shard(home: Path, tmp_path: Path, name: str, embedder: str, token_file: Path,
           **extra: object) -> tuple[EngramServer, ShardService]:
    server, service = build_shard_server(ShardSettings(
        home=home, port=0, db_url=f"sqlite:///{tmp_path / f'{name}.db'}", allow_ungated=True,
        embedder_addr=embedder, service_token_file=token_file, index_snapshot=False, **extra))
    return server.start(), service


def _caught_up(client: ShardClient, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout  # a bound on waiting, not a speed assertion
    while client.status().indexing_lag and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.status().indexing_lag == 0


@pytest.fixture(scope="module")
def minilm_service(engram_home: Path) -> Iterator[EngramServer]:
    server = _embedder(engram_home, embedder="minilm", threads=1)
    try:
        yield server
    finally:
        server.stop(0)


def test_two_shards_share_one_embedder_and_search_semantically(
        minilm_service: EngramServer, engram_home: Path, tmp_path: Path,
        make_token: TokenFactory, make_service_token: ServiceToken) -> None:
    token_file = _token_file(tmp_path, make_service_token)
    shards = [_shard(engram_home, tmp_path, f"replica-{i}", minilm_service.address, token_file)
              for i in range(2)]
    try:
        for number, (server, service) in enumerate(shards):
            index = service.search_engine.index
            assert index is not None and isinstance(index.embedder, RemoteEmbedder)
            # The model's identity is the service's: the packaged MiniLM's, as a local one.
            assert (index.embedder.name, index.embedder.dimension) == (
                f"{MINILM_NAME}-int8", 384)
            with ShardClient(server.address, make_token(f"agent-{number}", "fleet-e")) as client:
                client.add("The quarterly revenue report shows sales grew by twelve percent")
                target = client.add("My dog loves running on the beach every morning").record
                client.add("Kubernetes pods restart when the liveness probe fails")
                _caught_up(client)
                assert client.search("puppy playing by the sea", mode="lexical") == []
                for mode in ("semantic", "hybrid"):
                    found = client.search("puppy playing by the sea", mode=mode)
                    assert found[0].record.id == target.id, mode
            assert index.indexed("fleet-e") == 3
    finally:
        for server, _ in shards:
            server.stop(0)


def test_the_service_says_its_model_and_embeds_like_the_local_encoder(
        minilm_service: EngramServer, make_service_token: ServiceToken) -> None:
    from services.shard.retrieval.embedding_onnx import onnx_encoder
    from services.shard.retrieval.encoder_choice import encoder_spec

    client, stub = _client(minilm_service.address, make_service_token("shard"))
    with client:
        described = client.call(stub.Describe, pb.DescribeRequest())
        texts = ["a dog on the beach", "quarterly revenue"]
        reply = client.call(stub.Embed, pb.EmbedRequest(texts=texts))
    assert (reply.model, reply.dimension) == (described.model, described.dimension)
    vectors = np.frombuffer(reply.vectors, dtype="<f4").reshape(2, reply.dimension)
    chosen = encoder_spec("minilm", Path("."), True, "setting")
    assert chosen is not None
    local = onnx_encoder(chosen[0], int8=chosen[1])
    try:
        assert local.name == described.model
        np.testing.assert_allclose(vectors, local.embed(texts), atol=1e-5)
    finally:
        local.close()


@pytest.fixture(scope="module")
def small_limits(engram_home: Path) -> Iterator[EngramServer]:
    server = _embedder(engram_home, embedder="hash", allow_test_embedder=True,
                       limits=LimitsSettings(batch_items=3, content_bytes=64))
    try:
        yield server
    finally:
        server.stop(0)


@pytest.mark.parametrize(("texts", "reason", "setting"), [
    (["a", "b", "c", "d"], "LIMIT_EXCEEDED", "ENGRAM_LIMITS_BATCH_ITEMS"),
    (["fine", "é" * 33], "LIMIT_EXCEEDED", "ENGRAM_LIMITS_CONTENT_BYTES"),
    ([], "NO_TEXTS", None),
])
def test_bad_input_is_refused_with_its_reason(
        small_limits: EngramServer, make_service_token: ServiceToken, texts: list[str],
        reason: str, setting: str | None) -> None:
    client, stub = _client(small_limits.address, make_service_token("shard"))
    with client, pytest.raises(EngramRpcError) as refused:
        client.call(stub.Embed, pb.EmbedRequest(texts=texts))
    assert (refused.value.code, refused.value.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT, reason)
    if setting is not None:
        assert refused.value.metadata["setting"] == setting
        assert setting in refused.value.message


def test_within_the_limits_is_answered(small_limits: EngramServer,
                                       make_service_token: ServiceToken) -> None:
    client, stub = _client(small_limits.address, make_service_token("shard"))
    with client:
        reply = client.call(stub.Embed, pb.EmbedRequest(texts=["a", "b", "é" * 32],
                                                        background=True))
    assert reply.model == "hash-64" and len(reply.vectors) == 3 * 64 * 4


def test_only_the_shards_service_principal_may_call(
        small_limits: EngramServer, make_token: TokenFactory,
        make_service_token: ServiceToken) -> None:
    callers = [make_token("agent-1", "fleet-a", ("agent",)),
               make_token("ops", "fleet-a", ("admin", "governor")),
               make_service_token("compactor")]
    for token in callers:
        client, stub = _client(small_limits.address, token)
        with client:
            for method, request in ((stub.Embed, pb.EmbedRequest(texts=["x"])),
                                    (stub.Describe, pb.DescribeRequest())):
                with pytest.raises(EngramRpcError) as refused:
                    client.call(method, request)
                assert (refused.value.code, refused.value.reason) == (
                    grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")
    without_embedder = make_token("svc-shard", "system", ("service",),
                                  audience=("governance",))
    client, stub = _client(small_limits.address, without_embedder)
    with client, pytest.raises(EngramRpcError) as refused:
        client.call(stub.Describe, pb.DescribeRequest())
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_a_shard_rides_out_the_embedder_being_down(
        engram_home: Path, tmp_path: Path, make_token: TokenFactory,
        make_service_token: ServiceToken) -> None:
    embedder = _embedder(engram_home, embedder="hash", allow_test_embedder=True)
    port = int(embedder.address.rsplit(":", 1)[1])
    shard, service = _shard(engram_home, tmp_path, "alone", embedder.address,
                            _token_file(tmp_path, make_service_token),
                            embedder_timeout_seconds=0.5, embedder_query_timeout_seconds=0.5)
    client = ShardClient(shard.address, make_token("agent-down", "fleet-down"))
    try:
        first = client.add("the lighthouse keeper polishes the brass lamp").record
        _caught_up(client)
        embedder.stop(0)
        # Writes are acknowledged; they wait for their vectors, searchable lexically.
        later = client.add("zebra crossings painted on the harbour road").record
        assert client.get(later.id).content == later.content
        hybrid = client.search("zebra crossings harbour", mode="hybrid")
        assert [hit.record.id for hit in hybrid] == [later.id]
        assert [hit.record.id for hit in client.search("lighthouse lamp", mode="hybrid")] == [
            first.id]
        with pytest.raises(EngramRpcError) as down:
            client.search("zebra crossings harbour", mode="semantic")
        assert (down.value.code, down.value.reason) == (
            grpc.StatusCode.UNAVAILABLE, "EMBEDDER_UNAVAILABLE")
        time.sleep(1.0)  # the indexer tried, failed and put its batch back
        assert client.status().indexing_lag == 1
        embedder = _embedder(engram_home, embedder="hash", allow_test_embedder=True, port=port)
        _caught_up(client)  # the batch it put back is embedded once the service is back
        semantic = client.search("zebra crossings harbour", mode="semantic")
        assert semantic[0].record.id == later.id
        index = service.search_engine.index
        assert index is not None and index.indexed("fleet-down") == 2
    finally:
        client.close()
        shard.stop(0)
        embedder.stop(0)


def test_a_shard_does_not_start_without_the_embedders_model(
        engram_home: Path, tmp_path: Path, make_service_token: ServiceToken) -> None:
    from services.shard.retrieval.embedding_process import EmbedderUnavailable

    with pytest.raises(EmbedderUnavailable, match="START_TIMEOUT_SECONDS"):
        _shard(engram_home, tmp_path, "orphan", "127.0.0.1:1",
               _token_file(tmp_path, make_service_token), embedder_start_timeout_seconds=0.3)
    with pytest.raises(ValueError, match="SERVICE_TOKEN_FILE"):
        _shard(engram_home, tmp_path, "tokenless", "127.0.0.1:1", tmp_path / "missing")
