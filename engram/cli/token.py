"""`engram token create`: mint a bearer token with the deployment's signing key.

Minting is the server side's (``services.common.tokens``), so the command needs the server
extra; it imports it only when it runs.
"""

from __future__ import annotations

from pathlib import Path

import typer

from engram.cli._output import JSON_OPTION, emit_json, fail, server_extra, settings

app = typer.Typer(
    help="Issue bearer tokens (needs the signing key under $ENGRAM_HOME/auth).",
    no_args_is_help=True,
)


@app.command("create")
def create(
    agent: str = typer.Option(..., "--agent", help="agent id the token speaks for"),
    fleet: str = typer.Option(..., "--fleet", help="fleet (tenant) the agent belongs to"),
    role: list[str] = typer.Option(
        ["agent"], "--role", help="agent, governor, admin or service; repeat for several"
    ),
    key: Path | None = typer.Option(None, "--key", help="signing key (default: home/auth)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print a new token; use it with `ENGRAM_TOKEN=... engram ...`."""
    with server_extra("token create"):
        from services.common.errors import InvalidArgument
        from services.common.tokens import TokenSigner, key_paths
    key_path = key or key_paths(settings().home).private
    if not key_path.exists():
        raise fail(f"no signing key at {key_path}: run `engram up` once, or pass --key")
    try:
        token = TokenSigner.load(key_path).issue(agent, fleet, set(role))
    except InvalidArgument as error:
        raise fail(error.message) from None
    if as_json:
        emit_json({"token": token, "agent_id": agent, "fleet_id": fleet, "roles": sorted(role)})
    else:
        typer.echo(token)
