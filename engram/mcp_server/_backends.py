"""Who the MCP server calls, and with whose token.

The MCP server is a client of Engram like any other: one gRPC channel per service,
shared by every tool call, and per call a client carrying the *caller's* bearer token,
so the services' gate, trust ranking and fleet scoping apply to the caller exactly as
over gRPC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc

from engram.client import ArtifactsClient, ClientSettings, EngramRpcError, ShardClient, open_channel
from engram.client._bearer import bearer_of, malformed_authorization

MISSING_TOKEN = (
    "missing bearer token: send 'Authorization: Bearer <token>' with every HTTP request "
    "(see `engram token create`)"
)


class TokenSource(Protocol):
    """The bearer token of the caller of one tool call."""

    def token(self, headers: Mapping[str, str] | None) -> str: ...


@dataclass(frozen=True)
class FixedToken:
    """stdio: one caller, the process that started the server, with the token it was given."""

    value: str

    def token(self, headers: Mapping[str, str] | None) -> str:
        return self.value


class BearerHeader:
    """Streamable HTTP: every request names its caller in ``Authorization: Bearer``.

    No header is UNAUTHENTICATED; there is deliberately no fallback to a token of the
    server's own, which would let any HTTP caller act as whoever started the server.
    """

    def token(self, headers: Mapping[str, str] | None) -> str:
        value = ""
        if headers is not None:
            value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        problem = malformed_authorization(value)
        if problem is not None:  # the caller's mistake, said as such (not INTERNAL, not 429)
            raise EngramRpcError(grpc.StatusCode.UNAUTHENTICATED, problem, "TOKEN_MALFORMED")
        token = bearer_of(value)
        if not token:
            raise EngramRpcError(grpc.StatusCode.UNAUTHENTICATED, MISSING_TOKEN, "TOKEN_MISSING")
        return token


class Backends(Protocol):
    """The Engram clients a tool call uses, built for one caller's token."""

    def shard(self, token: str) -> ShardClient: ...

    def artifacts(self, token: str) -> ArtifactsClient: ...


class GrpcBackends:
    """Channels opened once from the client settings (addresses, TLS, timeout)."""

    def __init__(self, settings: ClientSettings) -> None:
        self._settings = settings
        self._shard = open_channel(settings.shard_addr, **settings.tls())
        self._artifacts = open_channel(settings.artifacts_addr, **settings.tls())

    def shard(self, token: str) -> ShardClient:
        # Not closed after the call: closing a client closes the shared channel.
        return ShardClient(self._settings.shard_addr, token, channel=self._shard,
                           timeout=self._settings.timeout_seconds)

    def artifacts(self, token: str) -> ArtifactsClient:
        return ArtifactsClient(self._settings.artifacts_addr, token, channel=self._artifacts,
                               timeout=self._settings.timeout_seconds)

    def close(self) -> None:
        self._shard.close()
        self._artifacts.close()
