"""Running the MCP server over stdio or streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Literal

from engram.client import ClientSettings
from engram.gateway._budget import BodyBudget, BodyLease, BodyRefused, token_holder
from engram.gateway._errors import http_status
from engram.gateway._holders import BodyHolders
from engram.gateway._json_values import too_many_values
from engram.mcp_server._backends import BearerHeader, FixedToken, GrpcBackends, TokenSource
from engram.mcp_server._server import build_mcp_server

Transport = Literal["stdio", "http"]
HTTP_PATH = "/mcp"
log = logging.getLogger("engram.mcp")

MAX_BODY = 4 * 1024 * 1024
"""The most of a request body buffered before the app sees it (the SDK's own limit)."""
BODIES_MAX = 4 * MAX_BODY
"""Bytes of request bodies buffered at once, all callers together: past it 503 with
Retry-After. Without it any number of connections each held a body for the body timeout
(found by review on 2026-11-30)."""
BODIES_PER_TOKEN = 2 * MAX_BODY
"""Of those, what one bearer token holds at once: past it 429 with Retry-After."""
BODIES_UNVERIFIED = MAX_BODY
"""What every caller whose token does not verify (or who sent none) holds together, when the
server has the services' public keys (:class:`~engram.gateway._holders.BodyHolders`)."""


def body_deadline(app: Any, seconds: float, budget: BodyBudget | None = None,
                  holders: BodyHolders | None = None) -> Any:
    """``app`` (ASGI) given each request's body only once all of it has arrived, within
    ``seconds`` of its headers: else 408 with ``Connection: close`` and the app never called
    (413 past ``MAX_BODY``, or holding more JSON values than a request may, counted before the
    SDK parses it: parsed, ``[{},{},...]`` takes 65 times its bytes). The SDK reads a body with
    no limit of time: one trickled a byte at a time held its connection, and SIGTERM waited on
    it for ever (found by review on 2026-11-29); told the client had gone, it answered 500
    with a traceback in the log. ``budget`` bounds the bytes of bodies buffered at once (by
    default :data:`BODIES_MAX`, :data:`BODIES_PER_TOKEN` a token, :data:`BODIES_UNVERIFIED`
    for tokens that do not verify), by the holder ``holders`` names (without: the
    Authorization value as spelt, every request without one a single holder)."""
    bodies = budget or BodyBudget(BODIES_MAX, BODIES_PER_TOKEN, BODIES_UNVERIFIED)
    holder_of = holders.holder if holders is not None else token_holder

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        # Held until the app has answered: the SDK parses the body and holds what it parsed.
        lease = bodies.lease(holder_of(_authorization(scope)))
        try:
            pieces = await _received(scope, receive, send, seconds, lease)
            if pieces is None:
                return
            body = b"".join(m.get("body", b"") for m in pieces if m["type"] == "http.request")
            # off the event loop, which serves every other connection meanwhile
            if (problem := await asyncio.to_thread(too_many_values, body)) is not None:
                await _refuse(send, 413, problem)
                return
            first: list[Any] = ([{"type": "http.request", "body": body, "more_body": False}]
                                if pieces[-1]["type"] == "http.request" else [pieces[-1]])

            async def replayed() -> Any:
                return first.pop() if first else await receive()

            await app(scope, replayed, send)
        finally:
            lease.release()

    return guarded


def _authorization(scope: Any) -> str:
    """The request's first Authorization header ("" when it has none)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return str(value.decode("latin-1"))
    return ""


async def _received(scope: Any, receive: Any, send: Any, seconds: float,
                    lease: BodyLease) -> list[Any] | None:
    """The request's messages up to its body's end (or the client leaving); None once refused
    (in time, size or budget)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    pieces: list[Any] = []
    size = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
        except TimeoutError:
            log.warning("a request body did not arrive in time; answered 408",
                        extra={"client": str(scope.get("client")), "body_timeout_s": seconds})
            await _refuse(send, 408, "the request body did not arrive in time")
            return None
        pieces.append(message)
        if message["type"] != "http.request":
            return pieces  # the client went away: the app hears it as it would have
        piece = len(message.get("body", b""))
        size += piece
        if size > MAX_BODY:
            await _refuse(send, 413, f"a request body may be at most {MAX_BODY} bytes")
            return None
        try:
            lease.take(piece)
        except BodyRefused as busy:
            await _refuse(send, http_status(busy.status), busy.status.message,
                          retry_after=True)  # 429 for the token's share, 503 for the total
            return None
        if not message.get("more_body", False):
            return pieces


async def _refuse(send: Any, status: int, message: str, *, retry_after: bool = False) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
               (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(settings: ClientSettings, transport: Transport = "stdio", *,
          host: str = "127.0.0.1", port: int = 8765,
          header_timeout_seconds: float = 10.0, body_timeout_seconds: float = 30.0) -> None:
    """Serve until the client closes stdin (stdio) or the process is interrupted (http).

    stdio acts as the token of the process that started it (``ENGRAM_TOKEN``, else the
    admin token ``engram up`` wrote); http acts as the bearer token of each request.
    """
    tokens: TokenSource = (FixedToken(settings.resolve_token()) if transport == "stdio"
                           else BearerHeader())
    backends = GrpcBackends(settings)
    server = build_mcp_server(backends, tokens)
    try:
        if transport == "stdio":
            server.run("stdio")
        else:
            # Stateless: each request stands alone with its own token, so replicas need no
            # sessions. On 127.0.0.1 the SDK also checks Host and Origin (DNS rebinding).
            # Served as the SDK would, but with the gateway's HTTP protocol: uvicorn has no
            # header timeout (headers sent a byte at a time held a connection for ever).
            import uvicorn

            from engram.gateway._http import header_timed

            app = server.streamable_http_app(streamable_http_path=HTTP_PATH,
                                             stateless_http=True, host=host)
            holders = BodyHolders.of_home(settings.home)
            if not holders.verifies:
                log.warning("no token public keys (ENGRAM_AUTH_PUBLIC_KEY(S), or $ENGRAM_HOME's "
                            "key pair): request bodies are budgeted by Authorization value, so "
                            "made-up tokens each get a share of their own (docs/mcp.md)")
            uvicorn.run(body_deadline(app, body_timeout_seconds, holders=holders),
                        host=host, port=port,
                        log_level="warning", http=header_timed(header_timeout_seconds),
                        timeout_graceful_shutdown=10)
    finally:
        backends.close()
