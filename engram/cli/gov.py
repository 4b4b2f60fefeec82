"""`engram gov`: trust tiers, write rules, gate decisions and the witness chain.

Changing tiers and rules needs a token with the governor (or admin) role; the
admin token `engram up` writes has both.
"""

from __future__ import annotations

from itertools import islice

import typer
from google.protobuf.message import Message
from rich.table import Table

from engram.cli._output import (
    JSON_OPTION,
    IntegrityFailure,
    console,
    emit_json,
    fail,
    message_dict,
    rpc_errors,
    verify_exits,
    with_client,
)
from engram.client.governance import TIER_NAMES, TIERS, GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb

app = typer.Typer(help="Governance: trust tiers, write rules, gate decisions, witness chain.",
                  no_args_is_help=True)
rules_app = typer.Typer(help="Write rules every shard write is checked against.",
                        no_args_is_help=True)
chain_app = typer.Typer(help="The SHAKE-256 witness chain over every governance change.",
                        no_args_is_help=True)
app.add_typer(rules_app, name="rules")
app.add_typer(chain_app, name="chain")

FLEET_OPTION = typer.Option("", "--fleet", help="fleet to act on (default: your token's fleet)")


def _client() -> GovernanceClient:
    return with_client(lambda s: GovernanceClient(s.governance_addr, s.resolve_token(),
                                                  **s.tls(), timeout=s.timeout_seconds))


def _show_trust(trust: pb.AgentTrust, as_json: bool) -> None:
    if as_json:
        emit_json(message_dict(trust) | {"tier": TIER_NAMES[trust.tier]})
        return
    pinned = " (set by an operator)" if trust.pinned else ""
    console.print(f"{trust.agent_id} in {trust.fleet_id}: [bold]{TIER_NAMES[trust.tier]}"
                  f"[/bold]{pinned}, multiplier {trust.multiplier}, score {trust.score:.3f}")


@app.command("tier")
def tier(
    agent: str = typer.Argument(..., help="agent id"),
    tier_name: str = typer.Argument(None, metavar="[TIER]",
                                    help="trusted, standard, probation or suspended; "
                                         "omit to show the agent's trust"),
    reason: str = typer.Option("", "--reason", help="why, recorded in the witness chain"),
    fleet: str = FLEET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Show an agent's trust, or set (and pin) its tier."""
    if tier_name is not None and tier_name.lower() not in TIERS:
        raise fail(f"unknown tier {tier_name!r}; choose one of {', '.join(TIERS)}")
    with rpc_errors(as_json), _client() as client:
        if tier_name is None:
            trust = client.trust(agent, fleet_id=fleet)
        else:
            trust = client.set_tier(agent, tier_name, reason=reason, fleet_id=fleet)
    _show_trust(trust, as_json)


@app.command("suspend")
def suspend(
    agent: str = typer.Argument(..., help="agent id"),
    reason: str = typer.Option("", "--reason", help="why, recorded in the witness chain"),
    fleet: str = FLEET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Suspend an agent: its writes are denied and its records leave search results."""
    with rpc_errors(as_json), _client() as client:
        trust = client.set_tier(agent, "suspended", reason=reason, fleet_id=fleet)
    _show_trust(trust, as_json)


def _rule_params(rule: pb.Rule) -> str:
    kind = rule.WhichOneof("kind")
    return f"{kind} " + ", ".join(f"{k}={v}" for k, v in message_dict(getattr(rule, kind)).items())


@rules_app.command("add")
def rules_add(
    max_bytes: int = typer.Option(None, "--max-bytes", help="size limit of the content"),
    deny: str = typer.Option(None, "--deny-pattern",
                             help="regex (safe subset, no backreferences/lookaround)"),
    case_sensitive: bool = typer.Option(False, "--case-sensitive",
                                        help="deny pattern matches case exactly"),
    require_tag: list[str] = typer.Option(None, "--require-tag", help="repeat for several"),
    allow_domain: list[str] = typer.Option(None, "--allow-domain",
                                           help="domains open to the rule's tiers; repeat"),
    max_writes: int = typer.Option(None, "--max-writes", help="rate: writes per --window"),
    window: int = typer.Option(60, "--window", help="rate window in seconds"),
    contradiction: bool = typer.Option(False, "--contradiction",
                                       help="deny writes that contradict their neighbours"),
    min_overlap: float = typer.Option(0.0, "--min-overlap", help="contradiction overlap (0..1)"),
    tier_names: list[str] = typer.Option(None, "--tier",
                                         help="apply only to agents in this tier; repeat"),
    description: str = typer.Option("", "--description", help="what the rule is for"),
    request_id: str = typer.Option("", "--request-id", help="idempotency key"),
    fleet: str = FLEET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Add one rule: give exactly one of the kind options."""
    kinds: list[tuple[str, Message]] = []
    if max_bytes is not None:
        kinds.append(("size_limit", pb.SizeLimit(max_bytes=max_bytes)))
    if deny is not None:
        kinds.append(("deny_pattern", pb.DenyPattern(pattern=deny, case_sensitive=case_sensitive)))
    if require_tag:
        kinds.append(("required_tags", pb.RequiredTags(tags=require_tag)))
    if allow_domain:
        kinds.append(("domain_access", pb.DomainAccess(allowed_domains=allow_domain)))
    if max_writes is not None:
        kinds.append(("rate_limit", pb.RateLimit(max_writes=max_writes, window_seconds=window)))
    if contradiction:
        kinds.append(("contradiction", pb.Contradiction(min_overlap=min_overlap)))
    if len(kinds) != 1:
        raise fail("give exactly one of --max-bytes, --deny-pattern, --require-tag, "
                   "--allow-domain, --max-writes, --contradiction")
    unknown = [t for t in tier_names or [] if t.lower() not in TIERS]
    if unknown:
        raise fail(f"unknown tier(s) {', '.join(unknown)}; choose from {', '.join(TIERS)}")
    rule = pb.Rule(fleet_id=fleet, description=description,
                   tiers=[TIERS[t.lower()] for t in tier_names or []])
    getattr(rule, kinds[0][0]).CopyFrom(kinds[0][1])
    with rpc_errors(as_json), _client() as client:
        reply = client.add_rule(rule, request_id=request_id)
    if as_json:
        emit_json({"rule": message_dict(reply.rule), "created": reply.created})
        return
    verb = "added" if reply.created else "already existed:"
    console.print(f"{verb} {reply.rule.rule_id}  {_rule_params(reply.rule)}")


@rules_app.command("list")
def rules_list(fleet: str = FLEET_OPTION, as_json: bool = JSON_OPTION) -> None:
    """List the fleet's rules."""
    with rpc_errors(as_json), _client() as client:
        rules = list(client.rules(fleet_id=fleet))
    if as_json:
        emit_json([message_dict(r) for r in rules])
        return
    table = Table(title=f"{len(rules)} rules")
    for column in ("rule", "kind and parameters", "tiers", "description"):
        table.add_column(column)
    for rule in rules:
        tiers = ", ".join(TIER_NAMES[t] for t in rule.tiers) or "all"
        table.add_row(rule.rule_id, _rule_params(rule), tiers, rule.description)
    console.print(table)


@rules_app.command("rm")
def rules_rm(rule_id: str = typer.Argument(..., help="rule id from `engram gov rules list`"),
             fleet: str = FLEET_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Remove a rule."""
    with rpc_errors(as_json), _client() as client:
        client.remove_rule(rule_id, fleet_id=fleet)
    if as_json:
        emit_json({"removed": rule_id})
    else:
        console.print(f"removed {rule_id}")


@app.command("decisions")
def decisions(
    agent: str = typer.Option("", "--agent", help="only this agent's decisions"),
    limit: int = typer.Option(50, "--limit", min=1, help="newest N decisions"),
    fleet: str = FLEET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Recorded gate decisions, newest first."""
    with rpc_errors(as_json), _client() as client:
        found = list(islice(client.decisions(agent_id=agent, fleet_id=fleet,
                                             page_size=min(limit, 1000)), limit))
    if as_json:
        emit_json([message_dict(d) for d in found])
        return
    table = Table(title=f"{len(found)} decisions")
    for column in ("decision", "agent", "record", "allowed", "rules", "reason"):
        table.add_column(column)
    for d in found:
        table.add_row(d.decision_id, d.agent_id, d.record_id,
                      "[green]yes[/green]" if d.allowed else "[red]no[/red]",
                      ", ".join(d.rule_ids), d.reason)
    console.print(table)


@app.command("erasures")
def erasures(as_json: bool = JSON_OPTION) -> None:
    """The fleet's recorded erasures, oldest first: each one's id (for `engram forget --resume
    ID`), what it selected, how many items it lists and when (governor or admin). --json gives
    each erasure without its items, with their count."""
    rows = []
    with rpc_errors(as_json), _client() as client:
        for erasure in client.erasures():
            row = message_dict(erasure)
            row.pop("items", None)
            rows.append(row | {"item_count": len(erasure.items)})
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"{len(rows)} erasures")
    table.add_column("erasure", no_wrap=True)  # whole: it is what --resume takes
    for column in ("selector", "items", "recorded", "chain entry", "by", "reason"):
        table.add_column(column, overflow="fold")
    for row in rows:
        selector = f"{row.get('selector_kind', '')} {row.get('selector_value', '')}".strip()
        table.add_row(row["erasure_id"], selector + (" (imported)" if row.get("imported") else ""),
                      str(row["item_count"]), row.get("create_time", ""),
                      str(row.get("chain_seq", "")), row.get("requested_by", ""),
                      row.get("reason", ""))
    console.print(table)


@chain_app.command("verify")
@verify_exits
def chain_verify(
    since_head: str = typer.Option("", "--since-head", help="a checkpoint head you held"),
    since_length: int = typer.Option(0, "--since-length", help="that checkpoint's length"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Re-walk the chain and check the stored state against it (and, with --since-head and
    --since-length, that it extends a checkpoint you held); exit 1 when broken, 2 when it
    could not finish."""
    if bool(since_head) != bool(since_length):
        raise fail("--since-head and --since-length go together: the head and the length of "
                   "one checkpoint (`engram gov chain checkpoint` prints both)", code=2)
    since = pb.ChainCheckpoint(head=since_head, length=since_length) if since_head else None
    with rpc_errors(as_json), _client() as client:
        report = client.verify_chain(since)
    if as_json:
        emit_json(message_dict(report) | {"ok": report.ok})
    elif report.ok:
        console.print(f"[green]chain intact[/green]: {report.checkpoint.length} entries, "
                      f"head {report.checkpoint.head}")
    else:
        console.print(f"[red]CHAIN BROKEN[/red]: {len(report.problems)} problem(s)")
        for problem in report.problems:
            console.print(f"  - {problem}")
    if not report.ok:
        raise IntegrityFailure()


@chain_app.command("checkpoint")
def chain_checkpoint(as_json: bool = JSON_OPTION) -> None:
    """Print the chain's head and length, to check later with `verify --since-head`."""
    with rpc_errors(as_json), _client() as client:
        checkpoint = client.checkpoint()
    if as_json:
        emit_json({"head": checkpoint.head, "length": checkpoint.length})
    else:
        console.print(f"head {checkpoint.head}  length {checkpoint.length}")
