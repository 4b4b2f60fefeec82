"""Engram as an MCP server (``engram mcp``): memory and run tools for agents, over stdio or
streamable HTTP, on the official ``mcp`` SDK (``pip install 'engram[mcp]'``).

The server is a client of the services: each tool call goes through the Python SDK with the
caller's token (``ENGRAM_TOKEN`` over stdio, the request's ``Authorization: Bearer`` over
HTTP), so the gate, trust and fleet scoping apply as over gRPC.
"""

from engram.mcp_server._backends import (
    Backends,
    BearerHeader,
    FixedToken,
    GrpcBackends,
    TokenSource,
)
from engram.mcp_server._serve import HTTP_PATH, Transport, serve
from engram.mcp_server._server import (
    TOOL_NAMES,
    RecallFilters,
    build_mcp_server,
    error_text,
    search_filter_names,
)

__all__ = [
    "HTTP_PATH",
    "TOOL_NAMES",
    "Backends",
    "BearerHeader",
    "FixedToken",
    "GrpcBackends",
    "RecallFilters",
    "TokenSource",
    "Transport",
    "build_mcp_server",
    "error_text",
    "search_filter_names",
    "serve",
]
