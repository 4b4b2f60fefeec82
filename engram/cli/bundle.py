"""Bundles: ``engram export`` writes one fleet's state to a file, ``engram import-bundle``
loads one into another instance (see docs/bundle.md)."""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from engram.bundle.export import Exporter, open_clients
from engram.bundle.format import BundleError, BundleReader
from engram.bundle.importer import Importer
from engram.cli._output import (
    JSON_OPTION,
    console,
    emit_json,
    err_console,
    fail,
    rpc_errors,
    server_extra,
)
from engram.cli._output import settings as cli_settings

if TYPE_CHECKING:  # needs the server extra
    from engram.bundle.reissue import Reissue


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Meter:
    """One progress bar per kind (rows, or bytes for blobs and verification), on stderr and
    hidden with --json; a kind with a known total shows how far along it is."""

    def __init__(self, progress: Progress, what: str, totals: dict[str, int] | None = None):
        self.progress, self.what, self.totals = progress, what, dict(totals or {})
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, kind: str, rows: int, nbytes: int) -> None:
        task = self.tasks.get(kind)
        if task is None:
            unit = "rows" if rows else "bytes"
            task = self.tasks[kind] = self.progress.add_task(
                f"{self.what} {kind} ({unit})", total=self.totals.get(kind))
        self.progress.advance(task, rows or nbytes)


def _progress(as_json: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                    disable=as_json, transient=True)


def export(
    fleet: str = typer.Option(..., "--fleet", help="the fleet to export; the token (ENGRAM_TOKEN "
                              "or the admin token) must belong to it"),
    run: str | None = typer.Option(None, "--run", help="only this run's records, artifacts, "
                                   "events, snapshots, manifests and iteration logs (with the "
                                   "fleet's domains, rules and the gate decisions and trust of "
                                   "their authors)"),
    out: Path = typer.Option(..., "-o", "--out", help="the bundle file to write; it appears only "
                             "once complete (written as <out>.partial, then renamed)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write a fleet's records, domains, governance state, runs, artifacts (with their blobs),
    events, snapshots, evidence, manifests, iteration logs, erasures and erased records'
    tombstones (no erased content) to one bundle file: a tar of
    JSON-lines parts and blobs with a MANIFEST.json of every member's SHA-256. Read through the
    services' own RPCs; memory stays bounded however large the fleet. Prints the manifest's
    content_digest: keep it to check the bundle later (engram import-bundle --expect)."""
    if out.exists():
        raise fail(f"{out} exists; remove it or choose another -o", code=2)
    if not out.parent.is_dir():
        raise fail(f"{out.parent} is not a directory; create it or choose another -o", code=2)
    started = time.perf_counter()
    with rpc_errors(as_json), _progress(as_json) as progress, _bundle_errors(as_json):
        clients = open_clients(cli_settings())
        try:
            totals = {} if run else {"records": clients.shard.status().total_records}
            meter = _Meter(progress, "exporting", totals)
            report = Exporter(clients, meter).export(out, fleet, run)
        finally:
            clients.close()
    seconds = time.perf_counter() - started
    summary = {
        "bundle": str(out), "fleet_id": fleet, "run_id": run,
        "content_digest": report.manifest.content_digest, "rows": report.rows,
        "blob_bytes": report.blob_bytes, "bundle_bytes": report.bundle_bytes,
        "seconds": round(seconds, 3),
        "records_per_second": round(report.rows.get("records", 0) / seconds, 1),
        "mb_per_second": round(report.bundle_bytes / 1e6 / seconds, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
    if as_json:
        emit_json(summary)
        return
    counts = ", ".join(f"{n} {kind}" for kind, n in report.rows.items() if n)
    console.print(f"wrote {out} ({report.bundle_bytes / 1e6:.1f} MB): {counts or 'nothing'}")
    console.print(f"content_digest {report.manifest.content_digest}")


def import_bundle(
    bundle: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                  help="a bundle written by engram export"),
    expect: str = typer.Option("", "--expect", help="refuse the bundle unless its "
                               "content_digest is this (the one export printed)"),
    reissue_key: Path | None = typer.Option(
        None, "--reissue-ids", dir_okay=False, metavar="KEYFILE",
        help="give records written before format 2 (ids derived from their text) new ids and "
             "salted commitments, and rename every reference to them (a bundle of the whole "
             "fleet); KEYFILE holds the key the new ids derive from (--new-reissue-key makes "
             "it; a re-run with the same key changes nothing). Delete KEYFILE once the import "
             "is complete: with it an erased text can be checked against a guess again"),
    new_key: bool = typer.Option(
        False, "--new-reissue-key",
        help="with --reissue-ids, make KEYFILE (it must not exist): for the first import only; "
             "a second key would import every re-addressed record again under other ids"),
    id_map: Path | None = typer.Option(
        None, "--id-map", dir_okay=False,
        help="with --reissue-ids, write each re-addressed record's old and new id here (JSON "
             "lines, readable by its owner only), to update references kept outside Engram; "
             "delete it too once done"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Load a bundle into this instance's fleet of the same name (admin token of that fleet).
    Every member's SHA-256 is checked against the manifest before anything is written; an
    altered bundle is refused with each failing member named (exit 1). Then everything is
    loaded as it was at the origin, each item re-checked by the service that stores it: rules,
    pinned trust tiers, gate decisions (chained as imported entries), erasures (chained, then
    carried out here: what they erased stays erased), erased records' tombstones, domains,
    records (ids, authors, times and hashes kept), runs with their artifacts (bytes
    re-hashed), manifests, evidence, events (the hash chain must extend), snapshots, and
    iteration logs (docs/bundle.md). Running it again changes nothing; after an interruption
    it completes what is missing. --json adds each step's seconds."""
    if (id_map is not None or new_key) and reissue_key is None:
        raise fail("--id-map and --new-reissue-key go with --reissue-ids KEYFILE", code=2)
    started = time.perf_counter()
    with rpc_errors(as_json), _progress(as_json) as progress, _bundle_errors(as_json):
        reissue = (_reissue(reissue_key, new_key) if reissue_key is not None
                   else None)  # before any call: a bad key file stops the import first
        clients = open_clients(cli_settings())
        try:
            with BundleReader(bundle) as reader:
                meter = _Meter(progress, "importing", {"verifying": reader.payload_bytes()})
                report = Importer(clients, meter, reissue=reissue).run(reader, expect)
            if reissue is not None and id_map is not None:
                _write_id_map(id_map, reissue)
        finally:
            clients.close()
    seconds = time.perf_counter() - started
    records = report.created.get("records", 0) + report.already_present.get("records", 0)
    summary = {
        "bundle": str(bundle), "fleet_id": report.manifest.fleet_id,
        "content_digest": report.manifest.content_digest, "created": report.created,
        "already_present": report.already_present, "not_imported": report.not_imported,
        "seconds": round(seconds, 3), "step_seconds": report.seconds,
        "records_per_second": round(records / seconds, 1),
        "mb_per_second": round(bundle.stat().st_size / 1e6 / seconds, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
    if reissue_key is not None:
        summary["reissued"] = report.reissued
    if as_json:
        emit_json(summary)
        return
    if reissue_key is not None:
        console.print(f"{report.reissued} records and tombstones written before format 2 got "
                      f"new ids; delete {reissue_key}"
                      + (f" and {id_map}" if id_map else "") + " once you have checked the "
                      "import: with it an erased text can be checked against a guess")
    console.print(f"verified {len(report.manifest.members)} members of {bundle} "
                  f"(content_digest {report.manifest.content_digest})")
    for kind, created in report.created.items():
        console.print(f"{kind}: {created} new, {report.already_present.get(kind, 0)} already "
                      "present")
    for kind, rows in report.not_imported.items():
        console.print(f"[yellow]{kind}: {rows} rows not imported (not supported yet)[/yellow]")


@contextmanager
def _bundle_errors(as_json: bool) -> Iterator[None]:
    """A BundleError as one line (or JSON naming every problem), exit 1."""
    try:
        yield
    except BundleError as error:
        _bundle_failure(str(error), error.problems, as_json)
    except OSError as error:
        # A local file (the bundle on a full disk, a token file): one line, not a traceback;
        # the writer has removed what it began.
        _bundle_failure(str(error) if error.filename else
                        f"the bundle could not be written or read: {error.strerror or error}",
                        [], as_json)
    except sqlite3.Error as error:
        _bundle_failure(f"the export's staging database: {error}", [], as_json)


def _bundle_failure(message: str, problems: list[str], as_json: bool) -> NoReturn:
    if as_json:
        emit_json({"error": {"message": message, "problems": problems}})
        raise typer.Exit(1)
    raise fail(message)


def _reissue(key_file: Path, new_key: bool) -> Reissue:
    with server_extra("import-bundle --reissue-ids"):  # it hashes records as the shard does
        from engram.bundle.reissue import Reissue, load_key, make_key

        if new_key:
            make_key(key_file)
        return Reissue(load_key(key_file))


def _write_id_map(path: Path, reissue: Reissue) -> None:
    """Old and new id of each re-addressed record, a JSON object a line, readable by its
    owner only, written whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.unlink(missing_ok=True)  # one left behind may be readable by others, or a link
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for pair in reissue.id_map():
                out.write(json.dumps(pair, sort_keys=True) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except OSError as error:
        raise BundleError(f"the import is complete, but the id map could not be written to "
                          f"{path}: {error.strerror}; run it again with the same key and "
                          "another --id-map") from None


def register(app: typer.Typer) -> None:
    app.command("export")(export)
    app.command("import-bundle")(import_bundle)
