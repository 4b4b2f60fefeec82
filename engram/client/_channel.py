"""Channels and the base every service client shares.

The bearer token travels as call metadata on every call (no channel
interceptor: it would add a Python hop to each call on the hot path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc

from engram.client._errors import EngramRpcError

Response = TypeVar("Response")
_CLIENT_TIMEOUT: Any = object()
"""Marks "use the client's timeout"; ``None`` means no deadline (long streams)."""
MAX_SEND_BYTES = 4 * 1024 * 1024
"""The servers' default request limit (ENGRAM_LIMITS_GRPC_RECEIVE_BYTES): a larger request
fails here, RESOURCE_EXHAUSTED, before it is sent."""
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
"""The servers' default response limit (ENGRAM_LIMITS_GRPC_SEND_BYTES)."""


def open_channel(target: str, tls_ca: Path | None = None, *, tls_cert: Path | None = None,
                 tls_key: Path | None = None, max_send_bytes: int = MAX_SEND_BYTES,
                 max_receive_bytes: int = MAX_RECEIVE_BYTES) -> grpc.Channel:
    """Plaintext without ``tls_ca``; TLS with it; mutual TLS with a client cert and key too.

    A certificate without its key (or the other way round), or a client certificate without
    the CA that checks the server, is a ``ValueError`` that names the settings to fix.
    Messages are limited both ways (a server configured for more: raise them to match).
    """
    options = [("grpc.max_send_message_length", max_send_bytes),
               ("grpc.max_receive_message_length", max_receive_bytes)]
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
        return grpc.insecure_channel(target, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls_ca.read_bytes(),
        private_key=tls_key.read_bytes() if tls_key else None,
        certificate_chain=tls_cert.read_bytes() if tls_cert else None,
    )
    return grpc.secure_channel(target, credentials, options=options)


class BaseClient:
    """Holds a channel and the caller's token; turns RpcError into EngramRpcError."""

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
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),)
        self.timeout = timeout

    def call(self, method: Callable[..., Response], request: Any, *,
             timeout: float | None = _CLIENT_TIMEOUT) -> Response:
        if timeout is _CLIENT_TIMEOUT:
            timeout = self.timeout
        try:
            return method(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise EngramRpcError.from_rpc_error(error) from None

    def stream(self, method: Callable[..., Iterable[Response]], request: Any, *,
               timeout: float | None = _CLIENT_TIMEOUT) -> Iterator[Response]:
        if timeout is _CLIENT_TIMEOUT:
            timeout = self.timeout
        try:
            yield from method(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise EngramRpcError.from_rpc_error(error) from None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
