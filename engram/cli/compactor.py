"""`engram compactor …`: iteration logs (record, recent, summaries, reconstruct, pin, verify)
and memory policies (compact-memory, retention, policy-runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from itertools import islice
from pathlib import Path
from typing import Any

import grpc
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from engram.cli._output import (
    JSON_OPTION,
    IntegrityFailure,
    console,
    emit_json,
    err_console,
    fail,
    message_dict,
    read_text,
    rpc_errors,
    verify_exits,
    when,
    with_client,
)
from engram.client import EngramRpcError
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.compactor.v1 import compactor_service_pb2 as pb

app = typer.Typer(
    help="Iteration logs (hot ring, hash-chained warm log, cold snapshots) and memory "
    "compaction policies. See docs/compactor.md.",
    no_args_is_help=True,
)


def _client() -> CompactorClient:
    return with_client(
        lambda s: CompactorClient(
            s.compactor_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds
        )
    )


def _summary_row(s: pb.IterationSummary) -> list[str]:
    return [str(s.iteration), s.status, when(s.start_time) or "-", str(s.files_touched),
            f"+{s.net_add}/-{s.net_del}", f"{s.risk_score:.2f}", s.plan_digest[:16],
            s.hash[:12]]


def _summary_table(rows: list[pb.IterationSummary], title: str) -> Table:
    table = Table(title=title)
    for column in ("iter", "status", "start", "files", "lines", "risk", "plan", "hash"):
        table.add_column(column)
    for summary in rows:
        table.add_row(*_summary_row(summary))
    return table


def _load_iterations(path: Path) -> list[dict[str, Any]]:
    text = read_text(path, "a JSON object or JSON Lines, one iteration a line")
    try:
        stripped = text.strip()
        if stripped.startswith("{") and "\n{" not in stripped:
            return [json.loads(stripped)]
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as error:
        raise fail(f"{path} is not a JSON object or JSONL of objects: {error}") from None


@app.command()
def record(
    run: str = typer.Argument(..., help="run id"),
    detail_file: Path = typer.Option(
        ..., "--detail-file", help="JSON object (or JSONL, one per line) with the fields "
        "iter, planDigest, parentDigest, startTs, endTs, filesTouched, netAdd, netDel, "
        "riskScore, status, plus 'detail' and 'guardrails'; iter omitted = next"),
    request_id: str = typer.Option(
        "", "--request-id", help="idempotency key: rerunning the command with the same key "
        "records nothing twice (line N of a JSONL file uses KEY:N)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Record one iteration (or each line of a JSONL file, with a progress bar)."""
    documents = _load_iterations(detail_file)
    try:
        messages = [iteration_from_json(d) for d in documents]
    except (ValueError, TypeError) as error:
        raise fail(f"{detail_file}: {error}") from None
    results: list[pb.RecordIterationResponse] = []
    with rpc_errors(as_json), _client() as client, Progress(
            TextColumn("recording"), BarColumn(), MofNCompleteColumn(), console=console,
            disable=as_json or len(messages) < 2) as progress:
        task = progress.add_task("record", total=len(messages))
        for number, message in enumerate(messages, start=1):
            key = request_id if not request_id or len(messages) == 1 else f"{request_id}:{number}"
            results.append(client.record(run, message, request_id=key))
            progress.advance(task)
    if as_json:
        emit_json([{"created": r.created, "summary": message_dict(r.summary)} for r in results])
        return
    for result in results:
        state = "recorded" if result.created else "already recorded"
        console.print(f"{state} iteration [bold]{result.summary.iteration}[/bold] of {run} "
                      f"(hash {result.summary.hash[:16]}…)")


@app.command()
def recent(run: str = typer.Argument(..., help="run id"), as_json: bool = JSON_OPTION) -> None:
    """The hot ring: the last N iterations with full detail, newest first."""
    with rpc_errors(as_json), _client() as client:
        rows = list(client.recent(run))
    if as_json:
        emit_json([message_dict(h) for h in rows])
        return
    console.print(_summary_table([h.summary for h in rows], f"hot ring of {run}"))


@app.command()
def summaries(
    run: str = typer.Argument(..., help="run id"),
    start: int = typer.Option(0, help="first iteration to list"),
    limit: int = typer.Option(0, help="stop after this many (0 = all)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Warm summaries in iteration order, across every segment."""
    with rpc_errors(as_json), _client() as client:
        pages = client.summaries(run, start_iteration=start, page_size=500)
        rows = list(islice(pages, limit) if limit else pages)
    if as_json:
        emit_json([message_dict(s) for s in rows])
        return
    console.print(_summary_table(rows, f"warm log of {run}"))


@app.command()
def reconstruct(
    run: str = typer.Argument(..., help="run id"),
    iteration: int = typer.Argument(..., help="iteration number"),
    as_json: bool = JSON_OPTION,
) -> None:
    """The full view of one iteration: hot ring, its cold snapshot, or the nearest earlier
    snapshot plus the warm summaries since."""
    with rpc_errors(as_json), _client() as client:
        view = client.reconstruct(run, iteration)
    document = message_dict(view) | {
        "source": pb.DetailSource.Name(view.source).removeprefix("DETAIL_SOURCE_").lower(),
    }
    if as_json:
        emit_json(document)
        return
    console.print(f"iteration [bold]{iteration}[/bold] of {run} from "
                  f"[cyan]{document['source']}[/cyan]"
                  + (f" (snapshot of iteration {view.base_iteration})"
                     if view.base_iteration and view.base_iteration != iteration else ""))
    console.print(_summary_table([view.summary], "summary"))
    if document["detail"] is not None:
        console.print_json(json.dumps({"detail": document["detail"],
                                       "guardrails": document["guardrails"]}))
    if view.trail:
        console.print(_summary_table(list(view.trail), "warm trail since the snapshot"))


@app.command()
def pin(
    run: str = typer.Argument(..., help="run id"),
    iteration: int = typer.Argument(..., help="iteration number"),
    reason: str = typer.Option(..., "--reason", help="why this iteration is an anomaly"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Mark an anomaly: the snapshot that reconstructs the iteration is kept by retention."""
    with rpc_errors(as_json), _client() as client:
        marker = client.pin(run, iteration, reason)
    if as_json:
        emit_json(message_dict(marker))
        return
    kept = (f"keeps the snapshot of iteration {marker.snapshot_iteration}"
            if marker.snapshot_iteration else "no snapshot was left to keep")
    console.print(f"pinned iteration {marker.iteration} of {run}: {kept}")


@app.command()
@verify_exits
def verify(run: str = typer.Argument(..., help="run id"), as_json: bool = JSON_OPTION) -> None:
    """Re-hash the warm chain across segments, the segments against the index and every kept
    cold snapshot; for a log erased whole, check its tombstone against the erasure governance
    recorded. Exits 1 when anything does not verify, 2 when it could not finish (a call failed,
    or an erasure could not be checked against governance)."""
    spinner = nullcontext() if as_json else console.status(f"verifying {run}")
    with rpc_errors(as_json), _client() as client, spinner:
        report = client.verify(run)
    if as_json:
        emit_json(message_dict(report))
    elif report.ok and report.erased:
        console.print(f"[green]ok[/green]: erased whole by {report.erasure_id} (head "
                      f"{report.head_hash[:16]}… at iteration {report.last_iteration})"
                      + ("" if report.tombstones_unconfirmed else
                         ", as governance recorded that erasure"))
        if report.tombstones_unconfirmed:
            err_console.print("[yellow]the erasure could not be checked against governance "
                              "(not reachable)[/yellow]")
    elif report.ok:
        console.print(f"[green]ok[/green]: {report.lines_checked} lines in "
                      f"{report.segments_checked} sealed segments + active, "
                      f"{report.snapshots_checked} snapshots; head {report.head_hash[:16]}… "
                      f"at iteration {report.last_iteration}"
                      + (f"; {report.tombstoned} erased in place" if report.tombstoned else ""))
        if report.tombstones_unconfirmed:
            err_console.print(f"[yellow]{report.tombstones_unconfirmed} erased iteration(s) "
                              "could not be checked against governance's erasures (not "
                              "reachable)[/yellow]")
    else:
        for problem in report.problems:
            console.print(f"[red]{problem.location}[/red]: {problem.detail}")
    if not report.ok:
        raise IntegrityFailure()
    if report.tombstones_unconfirmed:  # not verified: could not finish (README)
        raise typer.Exit(2)


def _print_policy_run(run: pb.PolicyRun, as_json: bool) -> None:
    if as_json:
        emit_json(message_dict(run))
        return
    kind = pb.PolicyKind.Name(run.kind).removeprefix("POLICY_KIND_").lower()
    mode = " (dry run)" if run.dry_run else ""
    console.print(f"{kind}{mode} of fleet [bold]{run.fleet_id}[/bold]: {run.outcome}; "
                  f"examined {run.examined}, compacted {run.compacted}, "
                  f"removed {len(run.removed_ids)}  [dim]policy run {run.id}[/dim]")
    for group in run.groups:
        target = group.summary_id or "(would be summarised)"
        console.print(f"  {group.domain}/{group.run_id or '-'}: {len(group.replaced_ids)} "
                      f"records -> {target}")
    if run.error:
        console.print(f"  [red]{run.error}[/red]")


@app.command("compact-memory")
def compact_memory(
    fleet: str = typer.Option("", "--fleet", help="fleet (default: your token's fleet)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="report without writing"),
    importance_below: float | None = typer.Option(
        None, help="decayed importance threshold (default 0.3)"),
    older_than_days: float | None = typer.Option(None, help="minimum age (default 30)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Ask the shard to summarise old, low-importance memories; originals stay verifiable."""
    with rpc_errors(as_json), _client() as client, _still_running_hint():
        run = client.compact_memory(fleet, dry_run=dry_run, importance_below=importance_below,
                                    older_than_days=older_than_days)
    _print_policy_run(run, as_json)


@app.command()
def retention(
    fleet: str = typer.Option("", "--fleet", help="fleet (default: your token's fleet)"),
    older_than_days: float = typer.Option(..., "--older-than-days",
                                          help="remove summarised originals older than this"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be removed"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Remove originals already covered by a summary (the summary keeps their hashes)."""
    with rpc_errors(as_json), _client() as client, _still_running_hint():
        run = client.apply_retention(fleet, older_than_days=older_than_days, dry_run=dry_run)
    _print_policy_run(run, as_json)


@contextmanager
def _still_running_hint() -> Iterator[None]:
    """A run past the call's deadline goes on in the compactor and is recorded: say where."""
    try:
        yield
    except EngramRpcError as error:
        if error.code != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        raise EngramRpcError(
            error.code, f"{error.message}; the run may still finish in the compactor: see "
            "`engram compactor policy-runs`", error.reason, error.metadata,
            error.retry_delay) from error


@app.command("policy-runs")
def policy_runs(
    fleet: str = typer.Option("", "--fleet", help="fleet (default: your token's fleet)"),
    limit: int = typer.Option(20, min=1, help="how many, newest first"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Past memory compaction and retention runs, scheduled or on demand."""
    with rpc_errors(as_json), _client() as client:
        rows = list(islice(client.policy_runs(fleet, page_size=min(limit, 100)), limit))
    if as_json:
        emit_json([message_dict(r) for r in rows])
        return
    for run in rows:
        _print_policy_run(run, False)
