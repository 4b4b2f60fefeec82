"""`engram forget`: erase records from every store that holds them (docs/erasure.md).

Three steps, each through a service's own RPC: the shard lists what the selector matches
(and the compaction summaries that quote it); governance chains the erasure (who, why, which
ids and the leaf hashes their tombstones keep); the shard erases exactly what governance
recorded. A selection larger than one erasure's 10,000 items is erased in rounds. With
``--dry-run`` only the first step runs.
"""

from __future__ import annotations

import uuid
from typing import Any

import typer

from engram.cli._output import (
    JSON_OPTION,
    console,
    emit_json,
    err_console,
    fail,
    rpc_errors,
    with_client,
)
from engram.client.governance import GovernanceClient
from engram.client.shard import ShardClient
from engram.governance.v1 import governance_service_pb2 as gpb

ROUND = 10_000


def forget(
    agent: str = typer.Option("", "--agent", help="every record this agent wrote"),
    record: str = typer.Option("", "--record", help="one record by id"),
    run: str = typer.Option("", "--run", help="every record of this run"),
    match: str = typer.Option("", "--match", help="every record whose content, a tag or a "
                              "metadata key or value holds this text (case-insensitive); the "
                              "text itself is not recorded anywhere"),
    fleet: str = typer.Option("", "--fleet", help="fleet (default: your token's fleet)"),
    reason: str = typer.Option("", "--reason", help="why, recorded in governance's chain"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be erased; change "
                                 "nothing"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Erase records: their content, tags, metadata and everything derived from them (full-
    text terms, vectors, search index, compaction summaries quoting them) leave every store;
    a tombstone keeps each record's leaf hash so chains and snapshots still verify. The
    erasure is a chained governance event. Governor or admin role."""
    chosen = [(k, v) for k, v in (("agent", agent), ("record", record), ("run", run),
                                  ("match", match)) if v]
    if len(chosen) != 1:
        raise fail("give exactly one of --agent, --record, --run or --match")
    kind, value = chosen[0]
    selector = {"agent": "agent_id", "record": "record_id", "run": "run_id",
                "match": "match"}[kind]
    shard = with_client(lambda s: ShardClient(s.shard_addr, s.resolve_token(), **s.tls(),
                                              timeout=s.timeout_seconds))
    governance = with_client(lambda s: GovernanceClient(
        s.governance_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds))
    erasures: list[dict[str, Any]] = []
    with shard, governance, rpc_errors(as_json):
        while True:
            listed = shard.forget(**{selector: value}, fleet_id=fleet, limit=ROUND)
            if dry_run or not listed.records:
                break
            recorded = governance.record_erasure(
                kind, "" if kind == "match" else value,
                [gpb.ErasedItem(kind=r.kind, id=r.record_id, leaf_hash=r.record_hash)
                 for r in listed.records],
                reason=reason, fleet_id=fleet, request_id=uuid.uuid4().hex).erasure
            done = shard.forget(erasure_id=recorded.erasure_id, fleet_id=fleet)
            erasures.append({"erasure_id": recorded.erasure_id, "chain_seq": recorded.chain_seq,
                             "erased": len(done.records), "already_erased": done.already_erased,
                             "record_ids": [r.record_id for r in done.records]})
            if not as_json:
                err_console.print(f"erasure {recorded.erasure_id} (chain entry "
                                  f"{recorded.chain_seq}): {len(done.records)} record(s) erased")
            if not listed.more or not done.records:
                break
    if dry_run:
        items = [{"record_id": r.record_id, "record_hash": r.record_hash, "kind": r.kind}
                 for r in listed.records]
        if as_json:
            emit_json({"dry_run": True, "would_erase": items, "more": listed.more})
        else:
            for item in items:
                console.print(f"{item['kind']} {item['record_id']}")
            more = " (and more: erase these, then ask again)" if listed.more else ""
            console.print(f"{len(items)} record(s) would be erased{more}")
        return
    total = sum(e["erased"] for e in erasures)
    if as_json:
        emit_json({"erased": total, "erasures": erasures})
    elif not erasures:
        console.print("nothing matches: nothing erased")
    else:
        console.print(f"{total} record(s) erased in {len(erasures)} erasure(s)")


def register(app: typer.Typer) -> None:
    app.command("forget")(forget)
