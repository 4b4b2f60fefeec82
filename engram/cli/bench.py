"""`engram bench NAME`: run a benchmark and print its figures (needs the server extra: it
starts the services itself).

Each benchmark lives in ``engram.bench.<name>`` and exposes
``run(scale: float, progress: bool) -> dict``; figures are reported beside a
raw gRPC echo measured in the same run (see ``engram.bench._harness``).
``fleet`` is the load generator: it takes its own options (agents, duration,
ratios, which stack) instead of ``--scale``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import typer

from engram.cli._output import JSON_OPTION, console, emit_json, fail, server_extra

BENCHMARKS = {
    "shard": "writes, batch ingest, lexical search and RSS of the shard service",
    "gate": "gated writes and trust-ranked search (shard + governance)",
    "artifacts": "streaming upload/download, metadata lookup, rehydrate",
    "compactor": "iteration record, reconstruct, append cost vs run length",
    "gateway": "the HTTP/JSON gateway's latency and throughput beside the SDK over gRPC",
    "search": "hybrid/semantic search, semantic indexing throughput and lag",
    "scale": "a lexical-only shard at 100k and --records records: search, RSS, restart time",
    "chroma": "Engram beside Chroma: as shipped and with the same embedder (`make compare-setup`)",
    "fleet": "load generator: N agents writing, searching, snapshotting, recording iterations "
    "and uploading artifacts at once, for --duration seconds",
}
FLEET = "fleet options (engram bench fleet)"


def bench(
    name: str = typer.Argument(..., help="one of: " + ", ".join(BENCHMARKS)),
    scale: float = typer.Option(
        1.0, help="multiply record/iteration counts (0.1 for a quick run); not for fleet"),
    out: Path | None = typer.Option(None, "--out", help="also write the JSON figures here"),
    as_json: bool = JSON_OPTION,
    filter_fraction: float | None = typer.Option(
        None, "--filter-fraction", min=0.0001, max=1.0,
        help="search: tag this share of the records (e.g. 0.01) and also time the same "
        "queries filtered to them (hybrid_filtered_p95_ms_at_N)"),
    records: int | None = typer.Option(
        None, "--records", min=2000,
        help="scale: records in the store (default: 1,000,000; with --scale, times it)"),
    agents: int | None = typer.Option(
        None, "--agents", min=1, rich_help_panel=FLEET,
        help="simulated agents, each a thread with its own token doing one operation after "
        "another (closed loop) (default: 16)"),
    duration: float | None = typer.Option(
        None, "--duration", min=0.1, rich_help_panel=FLEET,
        help="seconds of load; the run then stops by itself (default: 30)"),
    write_ratio: float | None = typer.Option(
        None, "--write-ratio", min=0, rich_help_panel=FLEET,
        help="share of operations that write one memory (CreateRecord, gated by governance) "
        "(default: 0.5)"),
    search_ratio: float | None = typer.Option(
        None, "--search-ratio", min=0, rich_help_panel=FLEET,
        help="share that search the agent's fleet (hybrid; lexical when the shard has no "
        "embedder) (default: 0.3)"),
    snapshot_ratio: float | None = typer.Option(
        None, "--snapshot-ratio", min=0, rich_help_panel=FLEET,
        help="share that read the agent's current run back (SnapshotForRun with verify; fewer "
        "records than acknowledged counts as error SNAPSHOT_SHORT) (default: 0.05)"),
    iteration_ratio: float | None = typer.Option(
        None, "--iteration-ratio", min=0, rich_help_panel=FLEET,
        help="share that record the run's next iteration (compactor) (default: 0.1)"),
    artifact_ratio: float | None = typer.Option(
        None, "--artifact-ratio", min=0, rich_help_panel=FLEET,
        help="share that upload a 1-4 KiB artifact (default: 0.05). Ratios are weights: "
        "they need not sum to 1, and 0 turns an operation off",
    ),
    fleets: int | None = typer.Option(
        None, "--fleets", min=1, rich_help_panel=FLEET,
        help="fleet: fleets the agents are spread over, round-robin; scale: fleets the records "
        "are spread over, a run of 50 records each in turn (default: 1)"),
    seed: int | None = typer.Option(
        None, "--seed", rich_help_panel=FLEET,
        help="seed of the agents' operation choices and texts (default: 1)"),
    start: bool | None = typer.Option(
        None, "--start/--no-start", rich_help_panel=FLEET,
        help="--start (the default): start all four services on 127.0.0.1 under a temporary "
        "directory and remove them afterwards. --no-start: load the stack `engram up` runs "
        "(addresses from ENGRAM_<SVC>_ADDR or $ENGRAM_HOME/endpoints.json, tokens minted with "
        "its signing key); what the agents write stays in it"),
    home: Path | None = typer.Option(
        None, "--home", rich_help_panel=FLEET,
        help="with --no-start: the ENGRAM_HOME of that stack (default: $ENGRAM_HOME); scale: "
        "keep the store there and reuse the records it already holds"),
    db: str | None = typer.Option(
        None, "--db", rich_help_panel=FLEET,
        help="with --start: sqlite, or postgres (a fresh database per service on "
        "--postgres-url's server, dropped afterwards) (default: sqlite)"),
    postgres_url: str | None = typer.Option(
        None, "--postgres-url", rich_help_panel=FLEET,
        help="with --db postgres: an admin URL of the server (default: "
        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres)"),
    embedder: str | None = typer.Option(
        None, "--embedder", rich_help_panel=FLEET,
        help="fleet with --start: the shard's embedder, none (search is lexical) or minilm "
        "(hybrid, as `engram up` runs) (default: none). search: minilm (default) or quality "
        "(the quality profile, minilm+mpnet, after `make mpnet`), with that profile's targets"),
) -> None:
    """Run one benchmark against services it starts itself on 127.0.0.1 (fleet: or against
    the running `engram up` stack with --no-start). Exits 1 when a fleet run had no
    operation succeed."""
    if name not in BENCHMARKS:
        raise fail(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    fleet_options = {
        "agents": agents, "duration_s": duration, "fleets": fleets, "seed": seed,
        "start": start, "home": home, "db": db, "postgres_url": postgres_url,
        "embedder": embedder,
    }
    ratios = {"write": write_ratio, "search": search_ratio, "snapshot": snapshot_ratio,
              "iteration": iteration_ratio, "artifact": artifact_ratio}
    scale_options: dict[str, Any] = ({"records": records, "home": home, "fleets": fleets}
                                     if name == "scale" else {})
    if embedder is not None and name not in ("fleet", "search"):
        raise fail("--embedder: only for `engram bench fleet` and `engram bench search`")
    if name == "search" and embedder is not None:
        scale_options["embedder"] = fleet_options.pop("embedder")
    if name == "scale":
        fleet_options.pop("home")
        fleet_options.pop("fleets")
    elif records is not None:
        raise fail("--records: only for `engram bench scale`")
    given = {k: v for k, v in fleet_options.items() if v is not None}
    given_ratios = {k: v for k, v in ratios.items() if v is not None}
    if name != "fleet" and (given or given_ratios):
        raise fail(f"{', '.join(sorted({*given, *given_ratios}))}: only for `engram bench fleet`")
    if name == "fleet" and scale != 1.0:
        raise fail("fleet takes --agents and --duration, not --scale")
    if filter_fraction is not None and name != "search":
        raise fail("--filter-fraction: only for `engram bench search`")
    with server_extra("bench"):
        from engram.bench._harness import BenchUnavailable

        module = importlib.import_module(f"engram.bench.{name}")
    kwargs: dict[str, Any] = {}
    if name == "fleet":
        kwargs["params"] = _fleet_params(module, given, given_ratios)
    if filter_fraction is not None:
        kwargs["filter_fraction"] = filter_fraction
    kwargs.update({k: v for k, v in scale_options.items() if v is not None})
    try:
        figures = module.run(scale=scale, progress=not as_json, **kwargs)
    except BenchUnavailable as error:
        raise fail(str(error)) from None
    if out is not None:
        out.write_text(json.dumps(figures, indent=2) + "\n")
    if as_json:
        emit_json(figures)
    elif name == "fleet":
        for table in module.summary_tables(figures):
            console.print(table)
    else:
        for key, value in figures.items():
            console.print(f"{key:>32}  {value}")
    if name == "fleet" and not figures["ops"]:
        errors = ", ".join(f"{code} x{count}" for code, count in figures["errors"].items())
        raise fail(f"no operation succeeded ({errors or 'none attempted'}); "
                   "is the stack healthy? each service's log says why")


def _fleet_params(module: Any, given: dict[str, Any], ratios: dict[str, float]) -> Any:
    """The fleet run's parameters; a value out of range is an error line, not a traceback."""
    defaults = module.FleetParams()
    if ratios:
        # Options not given keep their default weight: --search-ratio 0 turns search off only.
        given["ratios"] = {**defaults.ratios, **ratios}
    params = module.FleetParams(**given)
    try:
        params.check()
    except ValueError as error:
        raise fail(str(error)) from None
    return params
