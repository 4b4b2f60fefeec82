"""Running the MCP server over stdio or streamable HTTP."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from engram.client import ClientSettings
from engram.mcp_server._backends import BearerHeader, FixedToken, GrpcBackends, TokenSource
from engram.mcp_server._server import build_mcp_server

Transport = Literal["stdio", "http"]
log = logging.getLogger("engram.mcp")


def body_deadline(app: Any, seconds: float) -> Any:
    """``app`` (ASGI) with a deadline on each request's body: all of it within ``seconds`` of
    its headers, else the app is told the client went away (it answers no more, and the
    connection is closed after the header timeout). The SDK reads a body with no limit of
    time: one trickled a byte at a time held its connection, and SIGTERM waited on it for
    ever (found by review on 2026-11-29)."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        whole = False

        async def timed() -> Any:
            nonlocal whole
            if whole:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except TimeoutError:
                whole = True
                log.warning("a request body did not arrive in time; the request was dropped",
                            extra={"client": str(scope.get("client")),
                                   "body_timeout_s": seconds})
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                whole = True
            return message

        await app(scope, timed, send)

    return guarded
HTTP_PATH = "/mcp"


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
            uvicorn.run(body_deadline(app, body_timeout_seconds), host=host, port=port,
                        log_level="warning", http=header_timed(header_timeout_seconds),
                        timeout_graceful_shutdown=10)
    finally:
        backends.close()
