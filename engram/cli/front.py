"""`engram front-config`: the nginx configuration that refuses a service's excess calls before
they reach its Python process (engram/front.py, docs/reliability.md "Overload")."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from engram.cli._output import JSON_OPTION, console, emit_json, fail
from engram.front import FrontConfigError, FrontLimits, render


def front_config(
    upstream: str = typer.Option(
        "127.0.0.1:50051", help="HOST:PORT of the service the proxy passes calls to (in "
        "Kubernetes the sidecar's neighbour, 127.0.0.1)"),
    listen: str = typer.Option(
        "0.0.0.0:50061", help="HOST:PORT the proxy listens on for gRPC (plaintext HTTP/2; "
        "with TLS between clients and services, terminate it elsewhere)"),
    max_in_flight: int = typer.Option(
        16, help="calls in flight to the service, all callers together; one more is refused "
        "RESOURCE_EXHAUSTED OVERLOADED at once. Set it near what the service commits "
        "concurrently without queueing (fault test 6 used 8 on 2 cores)"),
    per_caller_in_flight: int = typer.Option(
        4, help="calls in flight one token may have (1 to --max-in-flight), so that one "
        "caller cannot take the whole total"),
    retry_after_ms: int = typer.Option(50, help="the delay a refusal's RetryInfo asks for"),
    workers: int = typer.Option(1, help="nginx worker processes"),
    state_dir: str = typer.Option("/tmp", help="where nginx keeps its pid file and "
                                               "temporary files (must be writable)"),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="write the configuration here (mode 0644) instead of "
        "printing it"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print the nginx configuration of a front proxy for one service.

    Run it as `nginx -c FILE` beside the service (deploy/components/front does so as a
    sidecar of each shard pod). Calls over either limit are answered by nginx itself,
    RESOURCE_EXHAUSTED with reason OVERLOADED and RetryInfo, the status the service's own
    admission sends; the rest pass to the service, which still authenticates and rate-limits
    every call."""
    try:
        text = render(upstream, listen, FrontLimits(max_in_flight, per_caller_in_flight,
                                                     retry_after_ms),
                      workers=workers, state_dir=state_dir)
    except FrontConfigError as error:
        raise fail(str(error), code=2) from None
    if out is None:
        if as_json:
            emit_json({"config": text, "path": None})
        else:
            console.print(text, end="", markup=False, highlight=False, soft_wrap=True)
        return
    partial = out.with_name(out.name + ".partial")
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, out)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise fail(f"cannot write {out}: {error.strerror or error}") from None
    if as_json:
        emit_json({"config": text, "path": str(out)})
