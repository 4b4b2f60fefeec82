"""Entry point of the `engram` command: one Typer app, a sub-app per area."""

from __future__ import annotations

import typer

from engram.cli import (
    artifacts,
    bench,
    bundle,
    compactor,
    evals,
    forget,
    front,
    gateway,
    gov,
    mcp,
    shard,
    token,
    up,
)

app = typer.Typer(
    help="Engram: durable, verifiable memory for fleets of AI agents.\n\n"
    "Where the commands look: ENGRAM_TOKEN (else $ENGRAM_HOME/auth/admin.token, which `engram "
    "up` writes; ENGRAM_HOME is ./.engram, relative to where you run it, unless set); each "
    "service at ENGRAM_<SHARD|GOVERNANCE|ARTIFACTS|COMPACTOR>_ADDR (else the ports `engram up` "
    "wrote to $ENGRAM_HOME/endpoints.json, else 127.0.0.1:50051-50054); TLS with "
    "ENGRAM_TLS_CA, ENGRAM_TLS_CERT, ENGRAM_TLS_KEY; each call's deadline "
    "ENGRAM_TIMEOUT_SECONDS (30; compaction and retention at least 300).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("up")(up.up)
shard.register(app)
artifacts.register(app)
bundle.register(app)
forget.register(app)
app.add_typer(gov.app, name="gov")
app.add_typer(compactor.app, name="compactor")
app.add_typer(token.app, name="token")
app.command("bench")(bench.bench)
app.add_typer(evals.app, name="eval")
app.command("mcp")(mcp.mcp)
app.command("gateway")(gateway.gateway)
app.command("front-config")(front.front_config)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
