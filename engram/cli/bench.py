"""`engram bench NAME`: run a benchmark and print its figures (needs the server extra: it
starts the services itself).

Each benchmark lives in ``engram.bench.<name>`` and exposes
``run(scale: float, progress: bool) -> dict``; figures are reported beside a
raw gRPC echo measured in the same run (see ``engram.bench._harness``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import typer

from engram.cli._output import JSON_OPTION, console, emit_json, fail, server_extra

BENCHMARKS = {
    "shard": "writes, batch ingest, lexical search and RSS of the shard service",
    "gate": "gated writes and trust-ranked search (shard + governance)",
    "artifacts": "streaming upload/download, metadata lookup, rehydrate",
    "compactor": "iteration record, reconstruct, append cost vs run length",
    "search": "hybrid/semantic search, semantic indexing throughput and lag",
    "chroma": "Engram beside Chroma: as shipped and with the same embedder (`make compare-setup`)",
}


def bench(
    name: str = typer.Argument(..., help="one of: " + ", ".join(BENCHMARKS)),
    scale: float = typer.Option(1.0, help="multiply record/iteration counts (0.1 for a quick run)"),
    out: Path | None = typer.Option(None, "--out", help="also write the JSON figures here"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run one benchmark against services it starts itself on 127.0.0.1."""
    if name not in BENCHMARKS:
        raise fail(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    with server_extra("bench"):
        from engram.bench._harness import BenchUnavailable

        module = importlib.import_module(f"engram.bench.{name}")
    try:
        figures = module.run(scale=scale, progress=not as_json)
    except BenchUnavailable as error:
        raise fail(str(error)) from None
    if out is not None:
        out.write_text(json.dumps(figures, indent=2) + "\n")
    if as_json:
        emit_json(figures)
        return
    for key, value in figures.items():
        console.print(f"{key:>32}  {value}")
