"""Running the MCP server over stdio or streamable HTTP."""

from __future__ import annotations

from typing import Literal

from engram.client import ClientSettings
from engram.mcp_server._backends import BearerHeader, FixedToken, GrpcBackends, TokenSource
from engram.mcp_server._server import build_mcp_server

Transport = Literal["stdio", "http"]
HTTP_PATH = "/mcp"


def serve(settings: ClientSettings, transport: Transport = "stdio", *,
          host: str = "127.0.0.1", port: int = 8765,
          header_timeout_seconds: float = 10.0) -> None:
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
            uvicorn.run(app, host=host, port=port, log_level="warning",
                        http=header_timed(header_timeout_seconds))
    finally:
        backends.close()
