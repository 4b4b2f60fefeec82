"""`engram mcp`: Engram's tools for agents over the Model Context Protocol.

Needs the mcp extra; the ``mcp`` SDK is imported only when the command runs.
"""

from __future__ import annotations

import math
from typing import Literal

import typer

from engram.cli._output import err_console, fail, settings

MCP_EXTRA = "pip install 'engram[mcp]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def mcp(
    transport: str = typer.Option(
        "stdio", help="stdio (an MCP client starts this process) or http (streamable HTTP)"
    ),
    host: str = typer.Option(
        "127.0.0.1", help="http: address to listen on; put anything else behind TLS"
    ),
    port: int = typer.Option(8765, help="http: port to listen on (endpoint path /mcp)"),
    header_timeout: float = typer.Option(
        10.0, help="http: seconds a connection has to send a request's line and headers, from "
        "its opening or the end of its previous response; then it is closed"),
    body_timeout: float = typer.Option(
        30.0, help="http: seconds a request's body has to arrive whole, from the end of its "
        "headers; then the request is dropped"),
) -> None:
    """Run the MCP server: remember, recall, get, list and verify memories; start, stop and
    log runs. stdio acts as ENGRAM_TOKEN; http as each request's Authorization: Bearer."""
    if transport not in ("stdio", "http"):
        raise fail(f"--transport must be stdio or http, got {transport!r}", code=2)
    for name, value in (("--header-timeout", header_timeout), ("--body-timeout", body_timeout)):
        if not (math.isfinite(value) and value > 0):
            raise fail(f"{name} must be a positive number of seconds, got {value}", code=2)
    try:
        from engram.mcp_server import serve
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("mcp"):
            raise
        raise fail(f"`engram mcp` needs the mcp extra: {MCP_EXTRA} "
                   f"(module {error.name!r} is not installed)") from None
    chosen: Literal["stdio", "http"] = "stdio" if transport == "stdio" else "http"
    if chosen == "http" and host not in LOOPBACK:
        err_console.print(f"[yellow]warning:[/yellow] plain HTTP on {host}: bearer tokens cross "
                          "the network in clear; serve it behind a TLS-terminating proxy",
                          soft_wrap=True)
    try:
        serve(settings(), chosen, host=host, port=port, header_timeout_seconds=header_timeout,
              body_timeout_seconds=body_timeout)
    except FileNotFoundError as error:  # no ENGRAM_TOKEN and no admin token (stdio)
        raise fail(str(error)) from None
