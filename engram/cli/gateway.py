"""`engram gateway`: the services over HTTP/JSON, with the paths of their google.api.http
annotations and an OpenAPI document at /openapi.json.

Needs the gateway extra; starlette and uvicorn are imported only when the command runs.
"""

from __future__ import annotations

import math

import typer

from engram.cli._output import err_console, fail, settings

GATEWAY_EXTRA = "pip install 'engram[gateway]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIN_RATE = 1.0
"""As engram.gateway._app.MIN_RATE (not imported: the extra may be missing)."""


def _rate(value: float) -> float:
    """0 (off) or a finite rate of at least MIN_RATE: a rate of 1e-320 made every byte worth
    more waiting than a float holds, which switched the guard off; nan and inf likewise."""
    if value == 0 or (math.isfinite(value) and value >= MIN_RATE):
        return value
    raise typer.BadParameter(f"must be 0 (off) or a finite number of bytes a second of at least "
                             f"{MIN_RATE:g}, got {value}")


def _seconds(value: float) -> float:
    """A positive, finite number of seconds: 0 would end every upload at once, nan and inf
    would switch the limit off."""
    if math.isfinite(value) and value > 0:
        return value
    raise typer.BadParameter(f"must be a positive number of seconds, got {value}")


def gateway(
    host: str = typer.Option("127.0.0.1", help="address to listen on; put anything else "
                                                "behind TLS"),
    port: int = typer.Option(8080, help="port to listen on"),
    log_level: str = typer.Option("warning", help="uvicorn's log level"),
    body_min_rate: float = typer.Option(
        16 * 1024, callback=_rate, help="bytes a second a request body (an upload) must "
        "average once its first ENGRAM_TIMEOUT_SECONDS have passed, else 408 BODY_TOO_SLOW and "
        "nothing is stored; 0 turns it off, else at least 1. A body that sends nothing for "
        "ENGRAM_TIMEOUT_SECONDS is 408 BODY_IDLE_TIMEOUT"),
    stream_min_rate: float = typer.Option(
        16 * 1024, callback=_rate, help="bytes a second the client of a download or "
        "NDJSON stream must take on average once ENGRAM_TIMEOUT_SECONDS of waiting on it have "
        "passed, else the stream is ended and its call cancelled (a client that stopped "
        "reading); at least 1, or 0 to turn this off: no limit on how slowly a client reads, so "
        "one that stops holds its stream until it disconnects. A stream whose service sends "
        "nothing for ENGRAM_TIMEOUT_SECONDS is ended either way"),
    uploads_per_token: int = typer.Option(
        8, min=1, help="uploads one token may have running at once, however its header spells "
        "it (of the gateway's 32 upload threads); one more is 429 UPLOAD_LIMIT with "
        "Retry-After"),
    uploads_max: int = typer.Option(
        24, min=1, max=24, help="uploads the gateway runs at once, whoever sends them; one more "
        "is 503 UPLOADS_BUSY with Retry-After at once. At most 24: 8 of the 32 upload threads "
        "stay free, so an upload let in never waits for a thread"),
    upload_answer_timeout: float = typer.Option(
        300.0, callback=_seconds, help="seconds an upload waits on the artifacts service to "
        "take the next part of its body or, once it has it whole, to answer; then the call is "
        "cancelled and the upload is 504 UPLOAD_ANSWER_TIMEOUT. Generous: the service stores a "
        "blob only once it has all of it (to S3 in one put up to 1 GiB)"),
    header_timeout: float = typer.Option(
        10.0, callback=_seconds, help="seconds a connection has to send a request's line and "
        "headers, from its opening or the end of its previous response; then it is closed (a "
        "client sending headers a byte at a time, or none, would hold it for ever)"),
) -> None:
    """Serve every annotated RPC of shard, governance, artifacts and compactor as HTTP/JSON.
    Each request acts as its own Authorization: Bearer token; no token is UNAUTHENTICATED."""
    try:
        from engram.gateway import serve
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in ("starlette", "uvicorn", "h11"):
            raise
        raise fail(f"`engram gateway` needs the gateway extra: {GATEWAY_EXTRA} "
                   f"(module {error.name!r} is not installed)") from None
    if host not in LOOPBACK:
        err_console.print(f"[yellow]warning:[/yellow] plain HTTP on {host}: bearer tokens cross "
                          "the network in clear; serve it behind a TLS-terminating proxy",
                          soft_wrap=True)
    try:
        serve(settings(), host=host, port=port, log_level=log_level,
              body_min_bytes_per_s=body_min_rate, uploads_per_token=uploads_per_token,
              stream_min_bytes_per_s=stream_min_rate, uploads_max=uploads_max,
              upload_answer_seconds=upload_answer_timeout,
              header_timeout_seconds=header_timeout)
    except (OSError, ValueError) as error:
        raise fail(str(error)) from None
