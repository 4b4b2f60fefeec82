"""Memory commands: add, query, search, get, list, status, snapshot, verify, import, domains."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from engram.cli._output import (
    JSON_OPTION,
    IntegrityFailure,
    console,
    count_progress,
    emit_json,
    fail,
    message_dict,
    read_text,
    rpc_errors,
    verify_exits,
    with_client,
)
from engram.client import ShardClient, record_filter, record_input
from engram.client.gate_audit import GateAudit, audit_records
from engram.client.governance import GovernanceClient
from engram.client.shard import parse_condition
from engram.shard.v1 import shard_service_pb2 as pb

IMPORT_BATCH = 200
IMPORT_BATCH_BYTES = 3 * 1024 * 1024
"""A batch call's records stay under this, below the servers' 4 MiB request limit."""


def _client() -> ShardClient:
    return with_client(
        lambda s: ShardClient(s.shard_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds)
    )


def _tags(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


_META = typer.Option([], "--meta", help="only records whose metadata has key=value (repeatable; "
                     "all must match)")
_TAG_ANY = typer.Option("", "--tag-any", help="only records carrying any of these (comma-sep.)")
_TAG_ALL = typer.Option("", "--tag-all", help="only records carrying all of these (comma-sep.)")
_AUTHOR = typer.Option("", "--author", help="only this author's (agent id's) records")
_AFTER = typer.Option(None, "--after", help="created after this RFC 3339 time")
_BEFORE = typer.Option(None, "--before", help="created before this RFC 3339 time")
_MIN_IMPORTANCE = typer.Option(None, "--min-importance", help="importance at least this (0..1)")


def _filter(meta: list[str], tag_any: str, tag_all: str, after: str | None,
             before: str | None, min_importance: float | None) -> dict[str, Any]:
    """The filter options as ``ShardClient.search`` / ``list`` arguments; bad input exits 2
    before anything is sent."""
    where: dict[str, Any] = {
        "metadata": dict(parse_condition(m) for m in meta) if meta else None,
        "tags_any": _tags(tag_any), "tags": _tags(tag_all), "created_after": after,
        "created_before": before, "min_importance": min_importance,
    }
    record_filter(**{k: v for k, v in where.items() if k != "tags"})  # checks; ValueError
    return where


def _checked(build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return build()
    except ValueError as error:
        raise fail(str(error), code=2) from None


def add(
    text: str = typer.Argument(..., help="the memory to store"),
    importance: float | None = typer.Option(None, help="0..1 (default 0.5)"),
    source: str = typer.Option("", help="origin: manual, agent, import …"),
    tags: str = typer.Option("", help="comma-separated tags"),
    run: str = typer.Option("", "--run", help="run id ('' = legacy, no run)"),
    domain: str = typer.Option("", help="domain; default: routed by keywords"),
    request_id: str = typer.Option("", help="idempotency key for safe retries"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Store a memory. Prints its id, content hash, domain and cross-references."""
    with rpc_errors(as_json), _client() as client:
        response = client.add(
            text,
            importance=importance,
            source=source,
            tags=_tags(tags),
            run_id=run,
            domain=domain,
            request_id=request_id,
        )
    record = response.record
    if as_json:
        emit_json(
            {
                "id": record.id,
                "content_hash": record.content_hash,
                "domain": record.domain,
                "cross_refs": list(record.cross_refs),
                "created": response.created,
                "duplicate_of": response.duplicate_of or None,
            }
        )
        return
    state = "stored" if response.created else "already stored"
    console.print(
        f"{state} [bold]{record.id}[/bold] in [cyan]{record.domain}[/cyan] "
        f"(sha256 {record.content_hash[:16]}…)"
    )
    for ref in record.cross_refs:
        console.print(f"  ↔ {ref}")


def _print_hits(hits: list[pb.SearchHit], as_json: bool) -> None:
    if as_json:
        emit_json(
            [
                {
                    "id": h.record.id,
                    "content": h.record.content,
                    "domain": h.record.domain,
                    "score": round(h.score, 6),
                    "via": h.via,
                    "agent_id": h.record.agent_id,
                    "run_id": h.record.run_id,
                }
                for h in hits
            ]
        )
        return
    if not hits:
        console.print("no matches")
        return
    table = Table()
    for column in ("score", "domain", "id", "content"):
        table.add_column(column)
    for hit in hits:
        marker = "" if hit.via == "direct" else " ↔"
        table.add_row(
            f"{hit.score:.3g}{marker}", hit.record.domain, hit.record.id[:12], hit.record.content
        )
    console.print(table)


def query(
    text: str = typer.Argument(..., help="what to look for"),
    limit: int = typer.Option(10, help="how many results (1..100)"),
    cross: bool = typer.Option(False, "--cross", help="also follow cross-reference links"),
    run: str | None = typer.Option(None, "--run", help="only this run ('' = legacy records)"),
    mode: str = typer.Option("hybrid", help="lexical, semantic or hybrid"),
    domain: str = typer.Option("", help="only this domain"),
    meta: list[str] = _META,
    tag_any: str = _TAG_ANY,
    tag_all: str = _TAG_ALL,
    author: str = _AUTHOR,
    after: str | None = _AFTER,
    before: str | None = _BEFORE,
    min_importance: float | None = _MIN_IMPORTANCE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Search memories across all domains of your fleet; filters apply before ranking."""
    if mode not in ("lexical", "semantic", "hybrid"):
        raise fail("--mode must be lexical, semantic or hybrid")
    where = _checked(lambda: _filter(meta, tag_any, tag_all, after, before, min_importance))
    with rpc_errors(as_json), _client() as client:
        hits = client.search(text, limit=limit, cross=cross, run_id=run, mode=mode,
                             domain=domain, author=author, **where)
    _print_hits(hits, as_json)


def search(
    domain: str = typer.Argument(..., help="domain to search (e.g. technical or shard_technical)"),
    text: str = typer.Argument(..., help="what to look for"),
    limit: int = typer.Option(10, help="how many results (1..100)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Search the memories of one domain only."""
    name = domain.removeprefix("shard_")
    with rpc_errors(as_json), _client() as client:
        hits = client.search(text, limit=limit, domain=name)
    _print_hits(hits, as_json)


def status(as_json: bool = JSON_OPTION) -> None:
    """Domains with record counts and importance; totals for your fleet."""
    with rpc_errors(as_json), _client() as client:
        reply = client.status()
    if as_json:
        emit_json(message_dict(reply))
        return
    table = Table(title=f"fleet {reply.fleet_id}")
    for column in ("domain", "records", "importance", "incoming links", "keywords"):
        table.add_column(column)
    for d in reply.domains:
        table.add_row(
            d.name,
            str(d.record_count),
            f"{d.importance:.2f}",
            str(d.incoming_links),
            ", ".join(d.keywords),
        )
    console.print(table)
    console.print(
        f"total: {len(reply.domains)} domains, {reply.total_records} records, "
        f"{reply.runs} runs, {reply.total_links} links, "
        f"indexing lag {reply.indexing_lag}"
        + (f" (model {reply.embedding_model})" if reply.embedding_model else " (lexical only)")
        + (f"; the previous model {reply.previous_embedding_model}'s vectors serve the records "
           "not re-embedded yet" if reply.previous_embedding_model else "")
    )


def get(
    record_id: str = typer.Argument(..., help="record id (from add, query or list)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show one memory with every stored field."""
    with rpc_errors(as_json), _client() as client:
        record = client.get(record_id)
    if as_json:
        emit_json(message_dict(record))
        return
    table = Table(title=record.id, show_header=False)
    for key, value in message_dict(record).items():
        table.add_row(key, escape(value if isinstance(value, str) else json.dumps(value)))
    console.print(table)


def list_(
    run: str | None = typer.Option(None, "--run", help="only this run ('' = legacy records)"),
    tags: str = typer.Option("", help="only records carrying all of these (comma-separated)"),
    domain: str = typer.Option("", help="only this domain"),
    agent: str = typer.Option("", "--agent", help="only this author's records"),
    limit: int = typer.Option(50, min=1, help="newest N records"),
    meta: list[str] = _META,
    tag_any: str = _TAG_ANY,
    tag_all: str = _TAG_ALL,
    author: str = _AUTHOR,
    after: str | None = _AFTER,
    before: str | None = _BEFORE,
    min_importance: float | None = _MIN_IMPORTANCE,
    as_json: bool = JSON_OPTION,
) -> None:
    """List memories of your fleet, newest first."""
    where = _checked(lambda: _filter(meta, tag_any, tag_all, after, before, min_importance))
    where["tags"] = sorted(set(where["tags"]) | set(_tags(tags)))
    if agent and author and agent != author:
        raise fail("--agent and --author name different authors", code=2)
    with rpc_errors(as_json), _client() as client:
        found = list(islice(client.list(run_id=run, domain=domain, agent_id=author or agent,
                                        page_size=min(limit, 1000), **where), limit))
    if as_json:
        emit_json([message_dict(r) for r in found])
        return
    table = Table(title=f"{len(found)} records")
    for column in ("id", "domain", "run", "author", "content"):
        table.add_column(column)
    for r in found:
        table.add_row(r.id[:12], r.domain, r.run_id, r.agent_id, escape(r.content))
    console.print(table)


def snapshot(
    run: str = typer.Argument(..., help="run id ('' for legacy records)"),
    no_verify: bool = typer.Option(False, "--no-verify", help="skip re-hashing each record"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Stream exactly the records of one run, re-hashing each (exit 2 on tampering); each
    record is printed as it comes (--json: one document once all have come)."""
    records: list[dict[str, object]] = []
    count = 0
    with rpc_errors(as_json), _client() as client:
        for record in client.snapshot(run, verify=not no_verify):
            count += 1
            if as_json:
                records.append(message_dict(record))
            else:
                console.print(f"{record.id}  {record.domain:<10} {record.content}")
    if as_json:
        emit_json({"run_id": run, "verified": not no_verify, "count": count, "records": records})
        return
    console.print(
        f"{count} records in run {run!r}"
        + (", all verified" if not no_verify else " (not verified)")
    )


def _gate_audit(record_id: str | None, as_json: bool) -> GateAudit:
    """Reconcile the fleet's records (or one) against governance's gate decisions; the whole
    fleet with a progress bar."""
    with (rpc_errors(as_json), _client() as client, _governance_client() as governance,
          count_progress("reconciling", as_json or bool(record_id)) as progress):
        if record_id:
            return audit_records([client.get(record_id)], governance)
        task = progress.add_task("audit", total=client.status().total_records or None)

        def counted() -> Iterator[pb.Record]:
            for record in client.list():
                yield record
                progress.advance(task)

        return audit_records(counted(), governance)


def _governance_client() -> GovernanceClient:
    return with_client(lambda s: GovernanceClient(s.governance_addr, s.resolve_token(),
                                                  **s.tls(), timeout=s.timeout_seconds))


def _report_gate(audit: GateAudit, as_json: bool) -> None:
    if as_json:
        emit_json({"checked": audit.checked, "ok": audit.ok, "problems": [
            {"id": p.record_id, "decision_id": p.decision_id, "detail": p.detail}
            for p in audit.problems]})
        return
    for problem in audit.problems:
        console.print(f"[red]NO GATE[/red] {problem.detail}")
    console.print(f"reconciled {audit.checked} records with governance's gate decisions: "
                  + ("[green]every one allowed[/green]" if audit.ok
                     else f"[red]{len(audit.problems)} without an allowing decision[/red]"))


def _verify_fleet(client: ShardClient, as_json: bool) -> pb.VerifyRecordsResponse:
    """Every record and tombstone of the fleet, a page a call, with a progress bar."""
    total = pb.VerifyRecordsResponse()
    with count_progress("verifying", as_json) as progress:
        task = progress.add_task("verify", total=client.status().total_records or None)
        for page in client.verify_pages():
            total.checked += page.checked
            total.tombstoned += page.tombstoned
            total.tombstones_unconfirmed += page.tombstones_unconfirmed
            total.failures.extend(page.failures)
            progress.update(task, completed=total.checked)
    return total


@verify_exits
def verify(
    record_id: str | None = typer.Argument(None, help="record id to verify"),
    all_records: bool = typer.Option(
        False, "--all", help="verify every record and tombstone of your fleet, a page of "
        "1,000 a call, with a progress bar"),
    gate: bool = typer.Option(
        False, "--gate", help="reconcile records (every one, or the id given) against "
        "governance's gate decisions instead of re-hashing them (governor or admin token)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Re-hash records and check tombstones (each erased record's must be listed by the
    erasure governance recorded), or reconcile records with gate decisions (--gate); exit code
    0 when all is intact, 1 on any failure, 2 when it could not finish without finding one (a
    call failed, or some tombstones could not be confirmed: governance unreachable)."""
    if gate:
        audit = _gate_audit(record_id, as_json)
        _report_gate(audit, as_json)
        if not audit.ok:
            raise IntegrityFailure()
        return
    if not record_id and not all_records:
        raise fail("give a record id or --all")
    with rpc_errors(as_json), _client() as client:
        report = (client.verify([record_id]) if record_id
                  else _verify_fleet(client, as_json))
    failures = [
        {
            "id": f.id,
            "expected_hash": f.expected_hash,
            "actual_hash": f.actual_hash,
            "detail": f.detail,
            "reason": f.reason,
            "erasure_id": f.erasure_id,
        }
        for f in report.failures
    ]
    unconfirmed = report.tombstones_unconfirmed
    if as_json:
        emit_json({"checked": report.checked, "tombstoned": report.tombstoned,
                   "tombstones_unconfirmed": unconfirmed,
                   "ok": not failures and not unconfirmed, "failures": failures})
    else:
        for failure in failures:
            console.print(f"[red]FAIL[/red] {failure['detail']}")
        if unconfirmed:
            console.print(f"[yellow]{unconfirmed} tombstones unconfirmed[/yellow]: governance "
                          "could not be asked whether their erasures list them; verify again "
                          "when it is reachable")
        erased = f" and {report.tombstoned} erased (tombstones)" if report.tombstoned else ""
        console.print(
            f"checked {report.checked} records{erased}: "
            + (
                "[green]all intact[/green]"
                if not failures
                else f"[red]{len(failures)} failed[/red]"
            )
        )
    if failures:
        raise IntegrityFailure()
    if unconfirmed:
        raise typer.Exit(2)


def import_(
    file: Path = typer.Argument(
        ...,
        exists=True,
        dir_okay=False,
        help="JSON Lines: one object per line with content and "
        "optional importance, source, tags, run_id, domain, metadata",
    ),
    batch: int = typer.Option(IMPORT_BATCH, help="records per batch call (max 1000)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Import memories in batches with a progress bar; each batch is all or nothing."""
    lines = [line for line in read_text(file, "JSON Lines, one record a line").splitlines()
             if line.strip()]
    inputs = []
    keys = []
    for number, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
            if not isinstance(item, dict) or not isinstance(item.get("content"), str):
                raise ValueError("needs a string 'content'")
            inputs.append(
                record_input(
                    item["content"],
                    run_id=str(item.get("run_id", "")),
                    domain=str(item.get("domain", "")),
                    source=str(item.get("source", "import")),
                    importance=item.get("importance"),
                    tags=list(item.get("tags", [])),
                    metadata={str(k): str(v) for k, v in dict(item.get("metadata", {})).items()},
                )
            )
        except (ValueError, TypeError) as error:
            raise fail(f"{file}:{number}: {error}") from None
        keys.append(line)
    created = existing = 0
    with (
        rpc_errors(as_json),
        _client() as client,
        Progress(
            TextColumn("importing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=as_json,
        ) as progress,
    ):
        task = progress.add_task("import", total=len(inputs))
        for start, end in _batches(inputs, batch, IMPORT_BATCH_BYTES):
            chunk = inputs[start:end]
            # Derived from the lines themselves: re-running an import retries, never duplicates.
            key = (
                "import:"
                + hashlib.sha256("\n".join(keys[start:end]).encode()).hexdigest()[:40]
            )
            for result in client.add_many(chunk, request_id=key).results:
                created += result.created
                existing += not result.created
            progress.advance(task, len(chunk))
    if as_json:
        emit_json(
            {
                "file": str(file),
                "records": len(inputs),
                "created": created,
                "already_present": existing,
            }
        )
    else:
        console.print(f"imported {len(inputs)} records: {created} new, {existing} already present")


domains_app = typer.Typer(help="List and configure routing domains.", no_args_is_help=True)


@domains_app.command("list")
def domains_list(as_json: bool = JSON_OPTION) -> None:
    """Domains of your fleet with keywords and importance."""
    with rpc_errors(as_json), _client() as client:
        found = client.domains()
    if as_json:
        emit_json([message_dict(d) for d in found])
        return
    for d in found:
        console.print(f"[cyan]{d.name}[/cyan] ({d.display_name}): {', '.join(d.keywords)}")


@domains_app.command("upsert")
def domains_upsert(
    name: str = typer.Argument(..., help="domain name (lowercase)"),
    keywords: str = typer.Option("", help="comma-separated routing keywords"),
    description: str = typer.Option("", help="what belongs here"),
    display_name: str = typer.Option("", help="human-readable name"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Create a domain or replace its keywords (admin role)."""
    with rpc_errors(as_json), _client() as client:
        reply = client.upsert_domain(
            name, display_name=display_name, description=description, keywords=_tags(keywords)
        )
    if as_json:
        emit_json(
            {
                "created": reply.created,
                "domain": message_dict(reply.domain),
            }
        )
        return
    console.print(("created " if reply.created else "updated ") + reply.domain.name)


def register(app: typer.Typer) -> None:
    app.command("add")(add)
    app.command("query")(query)
    app.command("search")(search)
    app.command("get")(get)
    app.command("list")(list_)
    app.command("status")(status)
    app.command("snapshot")(snapshot)
    app.command("verify")(verify)
    app.command("import")(import_)
    app.add_typer(domains_app, name="domains")


def _batches(inputs: list[pb.RecordInput], most: int, most_bytes: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each batch: at most ``most`` records and ``most_bytes`` (or one)."""
    bounds: list[tuple[int, int]] = []
    start = size = 0
    for index, message in enumerate(inputs):
        grows = message.ByteSize() + 8  # the field's tag and length
        if index > start and (index - start >= most or size + grows > most_bytes):
            bounds.append((start, index))
            start, size = index, 0
        size += grows
    if start < len(inputs):
        bounds.append((start, len(inputs)))
    return bounds
