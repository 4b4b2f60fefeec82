"""A gRPC proxy that answers UNAVAILABLE to a share of first attempts (fault test 7).

It stands where a flaky load balancer or sidecar would, between a client and one service:
every call is forwarded as raw bytes with its metadata; a call whose request bytes it has not
seen before (a first attempt: a retry resends the same bytes) fails with probability ``rate``,
half of those *before* the call reaches the service and half *after* the service answered,
the reply thrown away. The second kind is the one that makes duplicates if a write is not
idempotent: the service did the work, the client saw UNAVAILABLE and tries again.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import descriptor_pool

import engram.artifacts.v1.artifacts_service_pb2
import engram.compactor.v1.compactor_service_pb2
import engram.governance.v1.governance_service_pb2
import engram.shard.v1.shard_service_pb2  # noqa: F401  (registers the services' descriptors)

_HOP_BY_HOP = ("grpc-", ":", "user-agent", "content-type", "te")


def _forwarded(metadata: tuple[Any, ...]) -> tuple[tuple[str, Any], ...]:
    return tuple((m.key, m.value) for m in metadata if not m.key.startswith(_HOP_BY_HOP))


def _remaining(context: grpc.ServicerContext) -> float | None:
    """The caller's deadline for the forwarded call (a call without one has none)."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 86_400 else None


class FlakyProxy:
    def __init__(self, upstream: str, rate: float, seed: int = 7) -> None:
        self.rate = rate
        self.counts: Counter[str] = Counter()
        self._random = random.Random(seed)
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(upstream)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        self._server.add_generic_rpc_handlers((_Handler(self),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(1).wait()
        self._channel.close()

    def fate(self, method: str, request: bytes) -> str:
        """``pass``, ``before`` or ``after`` for this attempt."""
        key = hashlib.sha256(method.encode() + b"\0" + request).digest()
        with self._lock:
            first = key not in self._seen
            self._seen.add(key)
            roll = self._random.random()
            fate = "pass"
            if first and roll < self.rate:
                fate = "before" if roll < self.rate / 2 else "after"
            self.counts[fate if first else "retry"] += 1
            return fate

    def unary(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        fate = self.fate(method, request)
        if fate == "before":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected: proxy lost the call")
        call = self._channel.unary_unary(method)
        try:
            reply = call(
                request, metadata=_forwarded(context.invocation_metadata()),
                timeout=_remaining(context))
        except grpc.RpcError as error:
            context.set_trailing_metadata(_forwarded(error.trailing_metadata() or ()))
            context.abort(error.code(), error.details() or "")
        if fate == "after":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected: proxy lost the reply")
        return reply  # type: ignore[no-any-return]

    def client_stream(self, method: str, requests: Iterator[bytes],
                      context: grpc.ServicerContext) -> bytes:
        chunks = list(requests)  # an upload is small here; its bytes decide its fate
        fate = self.fate(method, b"".join(chunks))
        if fate == "before":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected: proxy lost the call")
        call = self._channel.stream_unary(method)
        try:
            reply = call(iter(chunks), metadata=_forwarded(context.invocation_metadata()),
                         timeout=_remaining(context))
        except grpc.RpcError as error:
            context.abort(error.code(), error.details() or "")
        if fate == "after":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected: proxy lost the reply")
        return reply  # type: ignore[no-any-return]

    def server_stream(self, method: str, request: bytes,
                      context: grpc.ServicerContext) -> Iterator[bytes]:
        call = self._channel.unary_stream(method)  # reads: passed through, never failed
        yield from call(request, metadata=_forwarded(context.invocation_metadata()),
                        timeout=_remaining(context))


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: FlakyProxy) -> None:
        self.proxy = proxy

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method  # type: ignore[attr-defined]
        service, _, name = method.lstrip("/").rpartition("/")
        try:
            described = descriptor_pool.Default().FindServiceByName(service).methods_by_name[name]
        except KeyError:
            return None
        proxy = self.proxy
        if described.client_streaming:
            return grpc.stream_unary_rpc_method_handler(
                lambda requests, context: proxy.client_stream(method, requests, context))
        if described.server_streaming:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: proxy.server_stream(method, request, context))
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: proxy.unary(method, request, context))
