"""An :class:`EmbeddingProvider` over gRPC: the shared embedding service (docs/embedder.md).

With ``ENGRAM_SHARD_EMBEDDER_ADDR`` set, a shard replica runs no encoder of its own: it
asks the embedding service (``python -m services.embedder``), which several replicas share.
The model's identity (the key its vectors are stored under) and dimension are the
service's, read with ``Describe`` when the shard starts; every ``Embed`` reply names its
model again, and a reply from another model (the service was redeployed with another
encoder) is refused, so a shard never stores vectors of two models under one name. Restart
the shard after changing the service's model (with ENGRAM_SHARD_PREVIOUS_EMBEDDER to keep
serving the old vectors while the records are re-embedded).

Every failure is :class:`EmbedderUnavailable` (UNAVAILABLE, EMBEDDER_UNAVAILABLE), as for
the local child process: a hybrid search then ranks lexically, and the indexer puts its
batch back and tries again later (records stay lexically searchable meanwhile). A query
tries twice within ``query_timeout`` seconds; an indexing batch keeps trying UNAVAILABLE
answers (the service restarting) until ``timeout`` seconds have passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np

from engram.client import EngramRpcError, TlsFiles
from engram.client._channel import BaseClient, open_channel
from engram.embedder.v1 import embedder_service_pb2 as pb
from engram.embedder.v1 import embedder_service_pb2_grpc as pb_grpc
from services.common.outbound import dependency_error
from services.shard.retrieval.embedding import Vectors
from services.shard.retrieval.embedding_process import EmbedderUnavailable

log = logging.getLogger("engram.shard.embedder")

RECONNECT_MS = 250
"""How often the channel tries a lost embedding service again."""
REQUEST_BYTES = 3 * 1024 * 1024
"""Texts one Embed call carries at most, in UTF-8 bytes (the service takes 4 MiB a request
by default, ENGRAM_LIMITS_GRPC_RECEIVE_BYTES); a larger batch goes in several calls."""
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0
_CREDENTIAL_HINT = "ENGRAM_SHARD_SERVICE_TOKEN_FILE (its aud must name embedder)"
Reply = TypeVar("Reply")


def chunks(texts: Sequence[str], max_texts: int,
           max_bytes: int = REQUEST_BYTES) -> Iterator[list[str]]:
    """``texts`` in order, in runs of at most ``max_texts`` and about ``max_bytes``."""
    chunk: list[str] = []
    size = 0
    for text in texts:
        length = len(text.encode("utf-8"))
        if chunk and (len(chunk) >= max_texts or size + length > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(text)
        size += length
    if chunk:
        yield chunk


class RemoteEmbedder:
    """The embedding service at ``address``, called with the shard's service token."""

    for_tests_only = False

    def __init__(self, address: str, token: str, *, tls: TlsFiles | None = None,
                 timeout: float = 30.0, query_timeout: float = 2.0, max_texts: int = 1000,
                 start_timeout: float = 120.0) -> None:
        self.address = address
        self.timeout = timeout
        self.query_timeout = query_timeout
        self.max_texts = max_texts
        channel = open_channel(address, **(tls or TlsFiles()), retries=False,
                               reconnect_backoff_ms=RECONNECT_MS)
        self._client = BaseClient(address, token, timeout=timeout, channel=channel)
        self._stub = pb_grpc.EmbedderServiceStub(self._client.channel)
        self._closed = threading.Event()
        described = self._describe(start_timeout)
        self.name: str = described.model
        self.dimension: int = described.dimension

    def _describe(self, start_timeout: float) -> pb.DescribeResponse:
        """The service's model; waits for a service still starting, up to ``start_timeout``."""
        deadline = time.monotonic() + start_timeout
        try:
            return self._call(lambda remaining: self._client.call(
                self._stub.Describe, pb.DescribeRequest(), timeout=remaining),
                deadline, attempts=None)
        except EmbedderUnavailable as error:
            self._client.close()
            raise EmbedderUnavailable(
                f"{error.message} (waited {start_timeout:.0f} s at start: "
                "ENGRAM_SHARD_EMBEDDER_START_TIMEOUT_SECONDS)") from None

    def _call(self, send: Callable[[float], Reply], deadline: float,
              attempts: int | None) -> Reply:
        """``send`` until it answers, an answer other than UNAVAILABLE, ``attempts`` tries
        or ``deadline``; every failure raised as :class:`EmbedderUnavailable`."""
        delay, tries = _FIRST_BACKOFF_S, 0
        while True:
            tries += 1
            remaining = deadline - time.monotonic()
            try:
                return send(max(0.001, remaining))
            except EngramRpcError as error:
                failure = error
            again = failure.code == grpc.StatusCode.UNAVAILABLE and (
                attempts is None or tries < attempts)
            if not again or self._closed.is_set() or time.monotonic() + delay >= deadline:
                raise self._unavailable(failure)
            self._closed.wait(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def _unavailable(self, failure: EngramRpcError) -> EmbedderUnavailable:
        error = dependency_error("embedder", self.address, failure,
                                 credential_hint=_CREDENTIAL_HINT)
        if failure.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # A refusal (a token without the embedder's audience, a limit set lower there)
            # is a deployment mistake, not the searcher's: say it loudly, serve lexically.
            log.error("the embedding service refused a call: %s", error.message)
        return EmbedderUnavailable(error.message, reason="EMBEDDER_UNAVAILABLE")

    def _embed(self, texts: Sequence[str], *, background: bool) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        budget, attempts = ((self.timeout, None) if background else (self.query_timeout, 2))
        deadline = time.monotonic() + budget
        parts = []
        for chunk in chunks(texts, self.max_texts):
            request = pb.EmbedRequest(texts=chunk, background=background)

            def send(remaining: float, request: pb.EmbedRequest = request) -> pb.EmbedResponse:
                return self._client.call(self._stub.Embed, request, timeout=remaining)

            reply = self._call(send, deadline, attempts)
            parts.append(self._vectors(reply, len(chunk)))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _vectors(self, reply: pb.EmbedResponse, count: int) -> Vectors:
        if reply.model != self.name or reply.dimension != self.dimension:
            log.error("the embedding service now runs another model; restart the shard to "
                      "re-embed with it", extra={"model": reply.model, "expected": self.name})
            raise EmbedderUnavailable(
                f"embedder service at {self.address} answered with model {reply.model!r} "
                f"({reply.dimension} dimensions), not {self.name!r} ({self.dimension}) that "
                "this shard's vectors are stored under; restart the shard to change model",
                reason="EMBEDDER_MODEL_CHANGED")
        if len(reply.vectors) != count * self.dimension * 4:
            raise EmbedderUnavailable(
                f"embedder service at {self.address} sent {len(reply.vectors)} bytes for "
                f"{count} vectors of {self.dimension}", reason="EMBEDDER_UNAVAILABLE")
        rows = np.frombuffer(reply.vectors, dtype="<f4").reshape(count, self.dimension)
        vectors: Vectors = rows.astype(np.float32)
        return vectors

    def embed(self, texts: Sequence[str]) -> Vectors:
        """A query or a write's duplicate check: two tries within ``query_timeout``."""
        return self._embed(texts, background=False)

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        """The indexer's batches: retried while the service restarts, up to ``timeout``."""
        return self._embed(texts, background=True)

    def close(self) -> None:
        self._closed.set()
        self._client.close()


def remote_embedder(address: str, token_file: Path | None, *, tls: TlsFiles,
                    timeout: float, query_timeout: float, max_texts: int,
                    start_timeout: float) -> RemoteEmbedder:
    """The provider ``ENGRAM_SHARD_EMBEDDER_ADDR`` names, with the shard's service token."""
    if token_file is None or not token_file.exists():
        raise ValueError("ENGRAM_SHARD_EMBEDDER_ADDR needs ENGRAM_SHARD_SERVICE_TOKEN_FILE: a "
                         "service token (role service, agent svc-shard) whose aud names embedder")
    return RemoteEmbedder(address, token_file.read_text().strip(), tls=tls, timeout=timeout,
                          query_timeout=query_timeout, max_texts=max_texts,
                          start_timeout=start_timeout)
