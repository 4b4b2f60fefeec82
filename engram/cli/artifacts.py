"""Artifacts commands: artifacts, runs, events, snapshots, evidence, manifests, rehydrate.

``register(app)`` adds the groups to the ``engram`` command. JSON arguments
accept inline JSON or ``@path`` to read a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import typer
from google.protobuf.message import Message
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.cli._output import (
    JSON_OPTION,
    IntegrityFailure,
    console,
    count_progress,
    emit_json,
    err_console,
    error_document,
    fail,
    message_dict,
    read_text,
    rpc_errors,
    status_line,
    verify_exits,
    with_client,
)
from engram.client import EngramRpcError
from engram.client.artifacts import STOP_STATUSES, ArtifactsClient, file_chunks

artifacts_app = typer.Typer(help="Store and fetch run-scoped artifacts (blobs with hashes).",
                            no_args_is_help=True)
runs_app = typer.Typer(help="Start, inspect and stop runs.", no_args_is_help=True)
events_app = typer.Typer(help="A run's append-only, hash-chained event log.",
                         no_args_is_help=True)
snapshots_app = typer.Typer(help="Append-only snapshots of a run's working state.",
                            no_args_is_help=True)
evidence_app = typer.Typer(help="The evidence ledger (deterministic evidence ids).",
                           no_args_is_help=True)
manifests_app = typer.Typer(help="Context manifests: what was in the window and why.",
                            no_args_is_help=True)


def _client() -> ArtifactsClient:
    return with_client(
        lambda s: ArtifactsClient(
            s.artifacts_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds
        )
    )


def _document(value: str) -> str:
    """Inline JSON, or ``@file`` holding it; checked here so mistakes fail before any call."""
    text = read_text(Path(value[1:]), "a JSON document") if value.startswith("@") else value
    try:
        json.loads(text)
    except ValueError as error:
        raise fail(f"not valid JSON: {error}") from None
    return text


def _show(message: Message, as_json: bool, title: str = "") -> None:
    if as_json:
        emit_json(message_dict(message))
        return
    table = Table(title=title or None, show_header=False)
    for key, value in message_dict(message).items():
        text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
        table.add_row(key, escape(text))
    console.print(table)


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                    disable=not enabled, transient=True)


# -- artifacts ---------------------------------------------------------------

@artifacts_app.command("put")
def put(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="file to upload"),
    run: str = typer.Option(..., "--run", help="run id"),
    step: str = typer.Option(..., "--step", help="step id inside the run"),
    name: str = typer.Option("", help="name inside run/step (default: the file's name)"),
    mime_type: str = typer.Option("", "--mime", help="MIME type (default octet-stream)"),
    meta: str = typer.Option("", "--meta", help="metadata: a JSON object or @file"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Stream a file to the run's artifacts; prints its id, path and SHA-256."""
    size = file.stat().st_size
    with rpc_errors(as_json), _client() as client, _progress(not as_json) as bar:
        task = bar.add_task(f"upload {file.name}", total=size)

        def chunks() -> Iterator[bytes]:
            for chunk in file_chunks(file):
                bar.advance(task, len(chunk))
                yield chunk

        artifact = client.upload(chunks(), run_id=run, step_id=step, name=name or file.name,
                                 mime_type=mime_type, metadata=_document(meta) if meta else None,
                                 size_bytes=size)
    if as_json:
        emit_json(message_dict(artifact))
        return
    console.print(f"stored [bold]{artifact.artifact_id}[/bold] at {artifact.path} "
                  f"({artifact.size_bytes} bytes, sha256 {artifact.hash[:16]}…)")


@artifacts_app.command("get")
def get(
    artifact_id: str = typer.Argument(..., help="artifact id"),
    output: Path = typer.Option(..., "-o", "--output", help="where to write the bytes"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Download an artifact; the file appears only if its size and SHA-256 match the artifact."""
    with rpc_errors(as_json), _client() as client, _progress(not as_json) as bar:
        tasks: list[TaskID] = []

        def advance(artifact: pb.Artifact, written: int) -> None:
            if not tasks:
                tasks.append(bar.add_task(f"download {artifact.path.rsplit('/', 1)[-1]}",
                                          total=artifact.size_bytes))
            bar.update(tasks[0], completed=written)

        artifact = client.download(artifact_id, output, progress=advance)
    if as_json:
        emit_json({**message_dict(artifact), "output": str(output)})
        return
    console.print(f"wrote {artifact.size_bytes} bytes to {output} (sha256 verified)")


@artifacts_app.command("info")
def info(artifact_id: str = typer.Argument(...), as_json: bool = JSON_OPTION) -> None:
    """Show an artifact's pointer: run, step, path, hash, MIME type, size, metadata."""
    with rpc_errors(as_json), _client() as client:
        artifact = client.get_artifact(artifact_id)
    _show(artifact, as_json, artifact_id)


@artifacts_app.command("ls")
def ls(
    run: str = typer.Option(..., "--run", help="run id"),
    step: str = typer.Option("", "--step", help="only this step"),
    as_json: bool = JSON_OPTION,
) -> None:
    """List a run's artifacts, oldest first."""
    with rpc_errors(as_json), _client() as client:
        found = list(client.list_artifacts(run, step))
    if as_json:
        emit_json([message_dict(a) for a in found])
        return
    table = Table()
    for column in ("artifact_id", "step", "path", "size", "sha256"):
        table.add_column(column)
    for a in found:
        table.add_row(a.artifact_id, a.step_id, a.path, str(a.size_bytes), a.hash[:16] + "…")
    console.print(table)


@artifacts_app.command("verify")
@verify_exits
def verify(
    run: str = typer.Option("", "--run", help="only this run (default: every run)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Re-hash every blob against its pointer, every snapshot's state and every manifest's
    content against its hash, and check every tombstone (an event or snapshot erased in
    place, and, without --run, a run erased whole) against the erasure governance recorded;
    exits 1 when any is missing, altered or erased by no erasure, and 2 when it could not
    finish without finding a problem (a call failed, or some tombstones could not be
    confirmed: governance unreachable)."""
    what = f"run {run}" if run else "the whole fleet (every blob re-hashed)"
    with rpc_errors(as_json), _client() as client, status_line(f"verifying {what}…", as_json):
        report = client.verify(run)
    if as_json:
        emit_json(message_dict(report))
    else:
        console.print(f"checked {report.checked} artifacts, {len(report.problems)} problems; "
                      f"{report.snapshots_checked} snapshots"
                      + (f" ({report.snapshots_tombstoned} erased: tombstones)"
                         if report.snapshots_tombstoned else "")
                      + f", {len(report.snapshot_problems)} problems; "
                      f"{report.events_tombstoned} erased events"
                      + (f", {report.runs_tombstoned} erased runs" if not run else "") + "; "
                      f"{len(report.tombstone_problems)} tombstone problems; "
                      f"{report.manifests_checked} manifests, "
                      f"{len(report.manifest_problems)} problems")
        for p in report.problems:
            console.print(f"  [red]{p.problem}[/red] {p.artifact_id} {p.path}")
        for s in report.snapshot_problems:
            console.print(f"  [red]{s.problem}[/red] snapshot {s.snapshot_id} of run {s.run_id}")
        for m in report.manifest_problems:
            console.print(f"  [red]{m.problem}[/red] manifest {m.manifest_id}"
                          + (f" of run {m.run_id}" if m.run_id else ""))
        for t in report.tombstone_problems:
            console.print(f"  [red]{t.problem}[/red] {t.kind} {t.id} (names erasure "
                          f"{t.erasure_id or '-'})")
        if report.tombstones_unconfirmed:
            console.print(f"  [yellow]{report.tombstones_unconfirmed} tombstones unconfirmed"
                          "[/yellow]: governance could not be asked whether their erasures "
                          "list them; verify again when it is reachable")
    if (report.problems or report.snapshot_problems or report.tombstone_problems
            or report.manifest_problems):
        raise IntegrityFailure()
    if report.tombstones_unconfirmed:
        raise typer.Exit(2)


# -- runs --------------------------------------------------------------------

@runs_app.command("start")
def run_start(
    run_id: str = typer.Argument("", help="run id (default: generated)"),
    meta: str = typer.Option("", "--meta", help="metadata: a JSON object or @file"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Start a run; prints its id."""
    with rpc_errors(as_json), _client() as client:
        reply = client.start_run(run_id, _document(meta) if meta else None)
    if as_json:
        emit_json({**message_dict(reply.run), "created": reply.created})
        return
    console.print(f"{'started' if reply.created else 'already running'} "
                  f"[bold]{reply.run.run_id}[/bold]")


@runs_app.command("status")
def run_status(run_id: str = typer.Argument(...), as_json: bool = JSON_OPTION) -> None:
    """Show a run: status, event count, head hash, latest snapshot."""
    with rpc_errors(as_json), _client() as client:
        run = client.get_run(run_id)
    _show(run, as_json, run_id)


@runs_app.command("stop")
def run_stop(
    run_id: str = typer.Argument(...),
    status: str = typer.Option("succeeded", help="one of: " + ", ".join(STOP_STATUSES)),
    reason: str = typer.Option("", help="why it stopped"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Stop a run; it takes no more events, snapshots or artifacts."""
    if status not in STOP_STATUSES:
        raise fail(f"--status must be one of {', '.join(STOP_STATUSES)}")
    with rpc_errors(as_json), _client() as client:
        run = client.stop_run(run_id, status, reason)
    _show(run, as_json, run_id)


@runs_app.command("ls")
def run_ls(as_json: bool = JSON_OPTION) -> None:
    """List the fleet's runs, newest first."""
    with rpc_errors(as_json), _client() as client:
        runs = list(client.list_runs())
    if as_json:
        emit_json([message_dict(r) for r in runs])
        return
    table = Table()
    for column in ("run_id", "status", "events", "latest snapshot"):
        table.add_column(column)
    for r in runs:
        table.add_row(r.run_id, message_dict(r)["status"], str(r.event_count), r.latest_snapshot_id)
    console.print(table)


@runs_app.command("resolve")
def run_resolve(
    run_id: str = typer.Argument(...),
    pointer_type: str = typer.Argument(..., help="artifact, evidence or manifest"),
    pointer_id: str = typer.Argument(...),
    non_critical: bool = typer.Option(False, "--non-critical",
                                      help="report a miss instead of stopping the run"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Resolve a pointer; a missing critical one is retried once, then stops the run."""
    if pointer_type not in ("artifact", "evidence", "manifest"):
        raise fail("pointer type must be artifact, evidence or manifest")
    with rpc_errors(as_json), _client() as client:
        reply = client.resolve(run_id, pointer_type, pointer_id, critical=not non_critical)
    _show(reply, as_json)


# -- events, snapshots, rehydrate ---------------------------------------------

@events_app.command("append")
def event_append(
    run_id: str = typer.Argument(...),
    type: str = typer.Argument(..., help="event type, e.g. tool.called"),
    payload: str = typer.Argument("null", help="JSON payload or @file"),
    manifest: str = typer.Option("", "--manifest", help="manifest id it refers to"),
    artifact: list[str] = typer.Option([], "--artifact", help="artifact id (repeatable)"),
    request_id: str = typer.Option("", help="idempotency key for safe retries"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Append an event to a running run; prints its seq and hash."""
    with rpc_errors(as_json), _client() as client:
        reply = client.append_event(run_id, type, _document(payload), manifest_id=manifest,
                                    artifact_ids=artifact, request_id=request_id)
    if as_json:
        emit_json({**message_dict(reply.event), "created": reply.created})
        return
    console.print(f"event {reply.event.seq} hash {reply.event.hash[:16]}…"
                  + ("" if reply.created else " (already appended)"))


@events_app.command("ls")
def event_ls(
    run_id: str = typer.Argument(...),
    after: int = typer.Option(0, "--after", help="only events with seq > AFTER"),
    as_json: bool = JSON_OPTION,
) -> None:
    """List a run's events in order."""
    with rpc_errors(as_json), _client() as client:
        events = list(client.list_events(run_id, after))
    if as_json:
        emit_json([message_dict(e) for e in events])
        return
    table = Table()
    for column in ("seq", "type", "payload", "hash"):
        table.add_column(column)
    for e in events:
        payload = f"(erased, {e.erasure_id})" if e.erasure_id else e.payload_json[:60]
        table.add_row(str(e.seq), e.type, payload, e.hash[:16] + "…")
    console.print(table)


@events_app.command("verify")
@verify_exits
def event_verify(run_id: str = typer.Argument(...), as_json: bool = JSON_OPTION) -> None:
    """Full replay of a run's log, re-checking the hash chain from seq 1 (an event erased in
    place is checked by its kept commitment and counted as a tombstone); exit code 0 when the
    chain is intact, 1 when the replay finds it broken (DATA_LOSS), 2 when it could not
    finish."""
    count, head, tombstoned = 0, "", 0
    with (rpc_errors(as_json), _client() as client, _broken_chain_is_integrity(run_id, as_json),
          count_progress("replaying", as_json, on=err_console, transient=True) as progress):
        task = progress.add_task("replay", total=client.get_run(run_id).event_count or None)
        for event in client.replay(run_id):
            count, head = event.seq, event.hash
            tombstoned += bool(event.erasure_id)
            progress.update(task, completed=count)
    if as_json:
        emit_json({"run_id": run_id, "events": count, "head_hash": head, "intact": True,
                   "tombstoned": tombstoned})
        return
    erased = f" ({tombstoned} erased: tombstones)" if tombstoned else ""
    console.print(f"{count} events{erased}, chain intact, head {head[:16]}…")


@contextmanager
def _broken_chain_is_integrity(run_id: str, as_json: bool) -> Iterator[None]:
    """A replay answered DATA_LOSS found the chain broken: an integrity failure (exit 1), not a
    call that could not finish (it exited 2, as a service unreachable did)."""
    try:
        yield
    except EngramRpcError as error:
        if error.code != grpc.StatusCode.DATA_LOSS:
            raise
        if as_json:
            emit_json({"run_id": run_id, "intact": False, "error": error_document(error)})
        else:
            err_console.print(f"[red]chain broken[/red]: {escape(error.message)}"
                              + (f" [{error.reason}]" if error.reason else ""), soft_wrap=True)
        raise IntegrityFailure() from None


@snapshots_app.command("put")
def snapshot_put(
    run_id: str = typer.Argument(...),
    state: str = typer.Argument(..., help="state as JSON or @file (at most 60 KiB)"),
    seq: int = typer.Option(0, help="last event the state includes (0 = current head)"),
    manifest: str = typer.Option("", "--manifest", help="manifest id"),
    artifact: list[str] = typer.Option([], "--artifact", help="required artifact id"),
    request_id: str = typer.Option("", help="idempotency key for safe retries"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Store a snapshot of the run's state and move its latest pointer."""
    with rpc_errors(as_json), _client() as client:
        snapshot = client.create_snapshot(run_id, _document(state), seq=seq,
                                          manifest_id=manifest, artifact_ids=artifact,
                                          request_id=request_id)
    _show(snapshot, as_json, snapshot.snapshot_id)


@snapshots_app.command("latest")
def snapshot_latest(run_id: str = typer.Argument(...), as_json: bool = JSON_OPTION) -> None:
    """Show the run's latest snapshot."""
    with rpc_errors(as_json), _client() as client:
        snapshot = client.latest_snapshot(run_id)
    _show(snapshot, as_json, snapshot.snapshot_id)


def rehydrate(
    run_id: str = typer.Argument(...),
    max_events: int = typer.Option(0, help="cap on events after the snapshot (0 = 10000)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Rebuild a run's runtime view: latest snapshot + events since (not a full replay)."""
    with rpc_errors(as_json), _client() as client:
        view = client.rehydrate(run_id, max_events)
    if as_json:
        emit_json(message_dict(view))
        return
    snap = view.snapshot
    console.print(f"run {view.run.run_id}: {view.run.event_count} events; "
                  + (f"snapshot {snap.snapshot_id} at seq {snap.seq}"
                     + (f" (erased, {snap.erasure_id}: no state)" if snap.erasure_id else "")
                     if snap.snapshot_id else "no snapshot") + f"; {len(view.events)} events since"
                  + (" (truncated)" if view.truncated else ""))


# -- evidence and manifests -----------------------------------------------------

@evidence_app.command("add")
def evidence_add(
    corpus_id: str = typer.Argument(...),
    index_id: str = typer.Argument(...),
    chunk_id: str = typer.Argument(...),
    start: int = typer.Argument(..., help="span start offset"),
    end: int = typer.Argument(..., help="span end offset (exclusive)"),
    artifact: str = typer.Option("", "--artifact", help="slice artifact id"),
    meta: str = typer.Option("", "--meta", help="metadata: a JSON object or @file"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Record evidence; the same corpus/index, chunk and span always get the same id."""
    with rpc_errors(as_json), _client() as client:
        reply = client.create_evidence(corpus_id, index_id, chunk_id, start, end,
                                       artifact_id=artifact,
                                       metadata=_document(meta) if meta else None)
    if as_json:
        emit_json({**message_dict(reply.evidence), "created": reply.created})
        return
    console.print(f"{'recorded' if reply.created else 'already recorded'} "
                  f"[bold]{reply.evidence.evidence_id}[/bold]")


@evidence_app.command("get")
def evidence_get(evidence_id: str = typer.Argument(...), as_json: bool = JSON_OPTION) -> None:
    """Show one evidence record."""
    with rpc_errors(as_json), _client() as client:
        evidence = client.get_evidence(evidence_id)
    _show(evidence, as_json, evidence_id)


@manifests_app.command("put")
def manifest_put(
    content: str = typer.Argument(..., help="manifest JSON or @file (at most 60 KiB)"),
    run: str = typer.Option("", "--run", help="run it was built for"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Store a context manifest inline; the same content again in the fleet answers the
    manifest stored first (created false)."""
    with rpc_errors(as_json), _client() as client:
        reply = client.create_manifest(_document(content), run)
    if as_json:
        emit_json({**message_dict(reply.manifest), "created": reply.created})
        return
    console.print(f"{'stored' if reply.created else 'already stored'} "
                  f"[bold]{reply.manifest.manifest_id}[/bold]")


@manifests_app.command("get")
def manifest_get(manifest_id: str = typer.Argument(...), as_json: bool = JSON_OPTION) -> None:
    """Show a manifest (its JSON content is checked against its hash)."""
    with rpc_errors(as_json), _client() as client:
        manifest = client.get_manifest(manifest_id)
    _show(manifest, as_json, manifest_id)


def register(app: typer.Typer) -> None:
    app.add_typer(artifacts_app, name="artifacts")
    app.add_typer(runs_app, name="runs")
    app.add_typer(events_app, name="events")
    app.add_typer(snapshots_app, name="snapshots")
    app.add_typer(evidence_app, name="evidence")
    app.add_typer(manifests_app, name="manifests")
    app.command("rehydrate")(rehydrate)
