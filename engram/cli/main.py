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
    help="Engram: durable, verifiable memory for fleets of AI agents.",
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
