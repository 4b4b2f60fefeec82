"""`engram gateway`: the services over HTTP/JSON, with the paths of their google.api.http
annotations and an OpenAPI document at /openapi.json.

Needs the gateway extra; starlette and uvicorn are imported only when the command runs.
"""

from __future__ import annotations

import typer

from engram.cli._output import err_console, fail, settings

GATEWAY_EXTRA = "pip install 'engram[gateway]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def gateway(
    host: str = typer.Option("127.0.0.1", help="address to listen on; put anything else "
                                                "behind TLS"),
    port: int = typer.Option(8080, help="port to listen on"),
    log_level: str = typer.Option("warning", help="uvicorn's log level"),
) -> None:
    """Serve every annotated RPC of shard, governance, artifacts and compactor as HTTP/JSON.
    Each request acts as its own Authorization: Bearer token; no token is UNAUTHENTICATED."""
    try:
        from engram.gateway import serve
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in ("starlette", "uvicorn"):
            raise
        raise fail(f"`engram gateway` needs the gateway extra: {GATEWAY_EXTRA} "
                   f"(module {error.name!r} is not installed)") from None
    if host not in LOOPBACK:
        err_console.print(f"[yellow]warning:[/yellow] plain HTTP on {host}: bearer tokens cross "
                          "the network in clear; serve it behind a TLS-terminating proxy",
                          soft_wrap=True)
    try:
        serve(settings(), host=host, port=port, log_level=log_level)
    except (OSError, ValueError) as error:
        raise fail(str(error)) from None
