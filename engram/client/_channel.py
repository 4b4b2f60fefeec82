"""Channels and the base every service client shares.

The bearer token travels as call metadata on every call (no channel
interceptor: it would add a Python hop to each call on the hot path).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol, Self, TypeVar

import grpc
from google.protobuf.message import Message

from engram.client._errors import EngramRpcError
from engram.client._retry import SERVICE_CONFIG
from engram.client._tracing import traced

Request = TypeVar("Request")
Response = TypeVar("Response")
Item = TypeVar("Item")
_Request_contra = TypeVar("_Request_contra", contravariant=True)
_Response_co = TypeVar("_Response_co", covariant=True)
CallMetadata = tuple[tuple[str, str], ...]


class UnaryCall(Protocol[_Request_contra, _Response_co]):
    """A stub method that answers once (unary-unary, or stream-unary with an iterator)."""

    def __call__(self, request: _Request_contra, /, timeout: float | None = None,
                 metadata: CallMetadata | None = None) -> _Response_co: ...


class StreamCall(Protocol[_Request_contra, _Response_co]):
    """A stub method that answers with a stream (unary-stream)."""

    def __call__(self, request: _Request_contra, /, timeout: float | None = None,
                 metadata: CallMetadata | None = None) -> Iterable[_Response_co]: ...


class PageRequest(Protocol):
    page_token: str


class PageReply(Protocol):
    @property
    def next_page_token(self) -> str: ...


PagedRequest = TypeVar("PagedRequest", bound=PageRequest)
PagedReply = TypeVar("PagedReply", bound=PageReply)


class _ClientTimeout:
    """Marks "use the client's timeout"; ``None`` means no deadline (long streams)."""


_CLIENT_TIMEOUT = _ClientTimeout()
MAX_SEND_BYTES = 4 * 1024 * 1024
"""The servers' default request limit (ENGRAM_LIMITS_GRPC_RECEIVE_BYTES): a larger request
fails here, RESOURCE_EXHAUSTED, before it is sent."""
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
"""The servers' default response limit (ENGRAM_LIMITS_GRPC_SEND_BYTES)."""


def reconnect_options(backoff_ms: int) -> list[tuple[str, int]]:
    """Channel options that try a lost server again every ``backoff_ms`` (jittered by gRPC).

    gRPC's default reconnect backoff starts at 1 s and grows 1.6 times per failed attempt up
    to 120 s, so a channel that lived through a server's restart can keep failing calls
    ("failed to connect to all addresses") for seconds to minutes after the server is back.
    """
    return [("grpc.initial_reconnect_backoff_ms", backoff_ms),
            ("grpc.min_reconnect_backoff_ms", backoff_ms),
            ("grpc.max_reconnect_backoff_ms", backoff_ms)]


RETRY_BUFFER_BYTES = 4 * 1024 * 1024
"""A streamed upload is retried only while all it sent fits this buffer (gRPC's default is
256 KiB); a larger one that fails is the caller's to send again (``upload_file`` can)."""


def idempotency_key(request_id: str = "") -> str:
    """``request_id``, or a new random one: the key a write keeps across gRPC's retries, so a
    retry of a write the service already did returns the first result instead of a second."""
    return request_id or uuid.uuid4().hex


def open_channel(target: str, tls_ca: Path | None = None, *, tls_cert: Path | None = None,
                 tls_key: Path | None = None, max_send_bytes: int = MAX_SEND_BYTES,
                 max_receive_bytes: int = MAX_RECEIVE_BYTES,
                 reconnect_backoff_ms: int | None = None, retries: bool = True) -> grpc.Channel:
    """Plaintext without ``tls_ca``; TLS with it; mutual TLS with a client cert and key too.

    A certificate without its key (or the other way round), or a client certificate without
    the CA that checks the server, is a ``ValueError`` that names the settings to fix.
    Messages are limited both ways (a server configured for more: raise them to match).
    ``reconnect_backoff_ms``: a lost server is tried again at that pace instead of gRPC's
    growing backoff (:func:`reconnect_options`; for a service's channel to another service).
    ``retries``: the SDK's retry policy (:mod:`engram.client._retry`); a service's channel
    to another service turns it off, so a failure is retried end to end by the caller, not
    again at every hop.
    """
    options: list[tuple[str, int | str]] = [
        ("grpc.max_send_message_length", max_send_bytes),
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.enable_retries", int(retries)),
    ]
    if retries:
        options += [("grpc.service_config", SERVICE_CONFIG),
                    ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES)]
    if reconnect_backoff_ms is not None:
        options += reconnect_options(reconnect_backoff_ms)
    if (tls_cert is None) != (tls_key is None):
        raise ValueError(
            "a client certificate needs its private key and a key needs its certificate: "
            "set both (ENGRAM_TLS_CERT and ENGRAM_TLS_KEY for the CLI)"
        )
    if tls_cert is not None and tls_ca is None:
        raise ValueError(
            "a client certificate (mutual TLS) also needs the CA that signed the server's "
            "certificate (ENGRAM_TLS_CA for the CLI)"
        )
    if tls_ca is None:
        return traced(grpc.insecure_channel(target, options=options))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls_ca.read_bytes(),
        private_key=tls_key.read_bytes() if tls_key else None,
        certificate_chain=tls_cert.read_bytes() if tls_cert else None,
    )
    return traced(grpc.secure_channel(target, credentials, options=options))


class BaseClient:
    """Holds a channel and the caller's token; turns RpcError into EngramRpcError.

    A unary call refused ``RESOURCE_EXHAUSTED`` with a ``RetryInfo`` delay (a server's
    concurrency or rate limit: nothing was done) is retried after that delay, up to
    ``max_retries`` times and never past the call's deadline.
    """

    max_retries = 3

    def __init__(
        self,
        target: str,
        token: str,
        *,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        timeout: float = 30.0,
        channel: grpc.Channel | None = None,
        max_send_bytes: int = MAX_SEND_BYTES,
    ) -> None:
        self.channel = channel or open_channel(target, tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                                               max_send_bytes=max_send_bytes)
        self.metadata: CallMetadata = (("authorization", f"Bearer {token}"),)
        self.timeout = timeout

    def call(self, method: UnaryCall[Request, Response], request: Request, *,
             timeout: float | _ClientTimeout | None = _CLIENT_TIMEOUT) -> Response:
        budget = self._deadline(timeout)
        deadline = None if budget is None else time.monotonic() + budget
        retries = self.max_retries if isinstance(request, Message) else 0  # not a used stream
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return method(request, metadata=self.metadata, timeout=remaining)
            except grpc.RpcError as error:
                failure = EngramRpcError.from_rpc_error(error)
            delay = failure.retry_delay
            if (retries <= 0 or failure.code != grpc.StatusCode.RESOURCE_EXHAUSTED
                    or delay is None
                    or (deadline is not None and time.monotonic() + delay >= deadline)):
                raise failure
            retries -= 1
            time.sleep(delay)

    def stream(self, method: StreamCall[Request, Response], request: Request, *,
               timeout: float | _ClientTimeout | None = _CLIENT_TIMEOUT) -> Iterator[Response]:
        try:
            yield from method(request, metadata=self.metadata, timeout=self._deadline(timeout))
        except grpc.RpcError as error:
            raise EngramRpcError.from_rpc_error(error) from None

    def paginate(self, method: UnaryCall[PagedRequest, PagedReply], request: PagedRequest,
                 items: Callable[[PagedReply], Iterable[Item]]) -> Iterator[Item]:
        """Every item of a List call, asking for the next page until a reply has no token."""
        while True:
            reply = self.call(method, request)
            yield from items(reply)
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    def _deadline(self, timeout: float | _ClientTimeout | None) -> float | None:
        return self.timeout if isinstance(timeout, _ClientTimeout) else timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def string_list(name: str, values: Iterable[str]) -> list[str]:
    """``values`` as a list; a bare string (a slip for a list of one) is a TypeError, not a
    list of its characters."""
    if isinstance(values, str):
        raise TypeError(f"{name} must be a list of strings, not the string {values!r}")
    return list(values)
