"""`engram forget`: erase records, runs and iteration logs from every store that holds them
(docs/erasure.md).

Three steps, each through a service's own RPC: the services list what the selector matches
(the shard its records and the compaction summaries quoting them; for ``--run`` also the
artifacts service's run and the compactor's iteration log, with the head hashes their
tombstones keep; for ``--match`` the format-2 events, snapshots and iterations holding the
text, and for
``--agent`` the agent's format-2 events in runs other agents started, each erased in place
with its run kept); governance chains the erasure (who, why, which items); each service then
erases exactly what governance recorded. A selection larger than one erasure's 10,000 items
is erased in rounds; for ``--match`` the finds of runs holding the text (FindRuns,
FindIterationLogs) are followed page by page to their end before anything is erased.
``--dry-run`` runs the first step only (every page of each selection); ``--resume
ERASURE_ID`` runs the last again (after a service was down or a run was interrupted).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import typer

from engram.cli._output import (
    JSON_OPTION,
    console,
    emit_json,
    err_console,
    fail,
    rpc_errors,
    status_line,
    with_client,
)
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient
from engram.client.governance import GovernanceClient
from engram.client.shard import ShardClient
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb

EMPTY_RUN_LEAF = "0" * 64
"""The leaf of a run with no events yet (empty head hash), as the artifacts service takes it."""

ROUND = 10_000
EXTRA_PER_ROUND = ROUND // 2
"""Run, iteration-log, event and snapshot items one erasure takes at most (the rest in the
next round); the records take what is left of the erasure."""
FIND_PAGE = 1000
"""Runs one FindRuns or FindIterationLogs page lists at most (``next_page_token`` past
that)."""
ARTIFACTS_KINDS = frozenset({"run", "event", "snapshot", "manifest", "evidence"})
"""The item kinds the artifacts service carries out (ForgetRuns)."""


class _Services:
    """The four clients, opened lazily from the CLI settings."""

    def __init__(self) -> None:
        self.shard = with_client(lambda s: ShardClient(
            s.shard_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds))
        self.governance = with_client(lambda s: GovernanceClient(
            s.governance_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds))
        self.artifacts = with_client(lambda s: ArtifactsClient(
            s.artifacts_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds))
        self.compactor = with_client(lambda s: CompactorClient(
            s.compactor_addr, s.resolve_token(), **s.tls(), timeout=s.timeout_seconds))
        self.format1_records: dict[str, None] = {}
        """The records (and summaries) selected that were written before format 2."""
        self.format1_manifests: dict[str, None] = {}
        """The manifests of no run found that were stored before format 2."""

    def selected(self, records: Any) -> None:
        """Note the format-1 records among a selection's (their tombstones keep derived ids)."""
        self.format1_records.update((r.record_id, None) for r in records if r.format == 1)

    def close(self) -> None:
        for client in (self.shard, self.governance, self.artifacts, self.compactor):
            client.close()

    def run_items(self, run_id: str) -> list[gpb.ErasedItem]:
        """The run's entries in artifacts and the compactor, if they hold it."""
        items = []
        run = _unless_absent(lambda: self.artifacts.get_run(run_id))
        if run is not None:
            items.append(gpb.ErasedItem(kind="run", id=run_id,
                                        leaf_hash=run.head_hash or EMPTY_RUN_LEAF))
        log = _unless_absent(lambda: self.compactor.verify(run_id))
        if log is not None and log.last_iteration:
            items.append(gpb.ErasedItem(kind="iterations", id=run_id, leaf_hash=log.head_hash))
        return items

    def runs_holding(self, text: str, as_json: bool) -> _Holding:
        """Runs whose artifacts-side data or iteration log holds the text, the events and
        snapshots of them that can be erased in place, and the manifests of no run and the
        evidence citing no artifact holding it: every page of both finds."""
        pages = _every_page(
            lambda token: self.artifacts.find_runs(text, FIND_PAGE, page_token=token),
            "runs holding the text", as_json)
        found = [run for page in pages for run in page.runs]
        loose = [i for page in pages for i in page.loose_items]
        found_logs = [run for page in _every_page(
            lambda token: self.compactor.find_iteration_logs(text, FIND_PAGE, page_token=token),
            "iteration logs holding the text", as_json) for run in page.runs]
        logs = [log.run_id for log in found_logs if log.whole_log_needed]
        lines = [gpb.ErasedItem(kind="iteration", id=f"{log.run_id}:{i.iteration}",
                                leaf_hash=i.leaf_hash)
                 for log in found_logs if not log.whole_log_needed for i in log.iterations]
        self.format1_manifests.update(
            (i.id, None) for i in loose if i.kind == "manifest" and i.format == 1)
        return _Holding(
            runs=list(dict.fromkeys([*(r.run_id for r in found),
                                     *(log.run_id for log in found_logs)])),
            whole=list(dict.fromkeys([*(r.run_id for r in found if r.whole_run_needed),
                                      *logs])),
            items=_erased_items(i for r in found for i in r.items) + lines,
            loose=_erased_items(loose))

    def agent_run_items(self, agent_id: str) -> tuple[list[gpb.ErasedItem], list[str]]:
        """Every run the agent started, in artifacts and the compactor, and its format-2
        events in runs other agents started (erased in place); the ids of its format-1
        events there (``<run>:<seq>``), which only erasing their whole run removes."""
        items: list[gpb.ErasedItem] = []
        legacy: list[str] = []
        for run in self.artifacts.list_runs():
            if run.agent_id == agent_id:
                items += self.run_items(run.run_id)
                continue
            for event in _unless_absent(lambda: list(self.artifacts.list_events(
                    run.run_id, page_size=1000))) or []:  # noqa: B023 (called at once)
                if event.agent_id != agent_id or event.erasure_id:
                    continue
                item_id = f"{run.run_id}:{event.seq}"
                if event.format == 2:
                    items.append(gpb.ErasedItem(kind="event", id=item_id,
                                                leaf_hash=event.hash))
                else:
                    legacy.append(item_id)
        return items, legacy

    def carry_out(self, erasure_id: str, kinds: set[str]) -> dict[str, Any]:
        """Each service that holds an item of the erasure erases it."""
        began = time.monotonic()
        done: dict[str, Any] = {"erasure_id": erasure_id}
        records = self.shard.forget(erasure_id=erasure_id)
        done["records"] = [r.record_id for r in records.records]
        done["already_erased"] = records.already_erased
        if kinds & ARTIFACTS_KINDS:
            runs = self.artifacts.forget_runs(erasure_id)
            done["runs"] = [{"run_id": r.run_id, "events": r.events, "snapshots": r.snapshots,
                             "artifacts": r.artifacts, "manifests": r.manifests,
                             "evidence": r.evidence} for r in runs.runs]
            done["events_erased"] = runs.events_erased
            done["snapshots_erased"] = runs.snapshots_erased
            done["manifests_erased"] = runs.manifests_erased
            done["evidence_erased"] = runs.evidence_erased
        if kinds & {"iterations", "iteration"}:
            logs = self.compactor.forget_iterations(erasure_id)
            done["iteration_logs"] = [{"run_id": r.run_id, "last_iteration": r.last_iteration,
                                       "blobs": r.blobs} for r in logs.runs]
            done["iterations_erased"] = logs.iterations_erased
        done["seconds"] = round(time.monotonic() - began, 3)
        return done


@dataclass
class _Holding:
    runs: list[str] = field(default_factory=list)
    """Every run holding the text (artifacts or the compactor)."""
    whole: list[str] = field(default_factory=list)
    """Those holding it where only erasing the whole run removes it."""
    items: list[gpb.ErasedItem] = field(default_factory=list)
    """Format-2 events, snapshots and iterations holding it: erased in place, their runs and
    logs kept."""
    loose: list[gpb.ErasedItem] = field(default_factory=list)
    """Manifests of no run and evidence citing no artifact holding it: deleted."""


def _erased_items(found: Iterable[Any]) -> list[gpb.ErasedItem]:
    """Found items (FindRuns' FoundItem) as governance's erasure lists them, each once."""
    return list({(i.kind, i.id): gpb.ErasedItem(kind=i.kind, id=i.id, leaf_hash=i.leaf_hash)
                 for i in found}.values())


def _every_page(fetch: Callable[[str], Any], what: str, as_json: bool) -> list[Any]:
    """Every page ``fetch`` answers (given the previous page's ``next_page_token``), saying
    how far it got on standard error while there are more (not with ``--json``)."""
    pages = [fetch("")]
    while pages[-1].next_page_token:
        if not as_json:
            err_console.print(f"listing {what}: {len(pages)} page(s) so far")
        pages.append(fetch(pages[-1].next_page_token))
    return pages


def _unless_absent(call: Any) -> Any:
    try:
        return call()
    except EngramRpcError as error:
        if error.code == grpc.StatusCode.NOT_FOUND:
            return None
        raise


LEFT_EXIT = 3
"""Exit status of an erasure that left the text in runs only erasing them whole removes."""


def forget(
    agent: str = typer.Option("", "--agent", help="every record this agent wrote, every "
                              "run it started (as --run does) and its events in runs other "
                              "agents started (erased in place, those runs kept; format-1 "
                              "events are listed, not erased)"),
    record: str = typer.Option("", "--record", help="one record by id"),
    run: str = typer.Option("", "--run", help="the run: its records, and its events, "
                            "snapshots, artifacts, manifests and iteration log"),
    match: str = typer.Option("", "--match", help="every record whose content, a tag or a "
                              "metadata key or value holds this text (case-insensitive), "
                              "every format-2 event payload, snapshot state and iteration "
                              "(its warm line and detail) holding it (erased in place, their "
                              "runs and logs kept), and every manifest of no "
                              "run and evidence citing no artifact holding it; the text "
                              "itself is not recorded anywhere"),
    whole_runs: bool = typer.Option(False, "--whole-runs", help="with --match: erase whole, "
                                    "instead, every run whose metadata, stop reason, events, "
                                    "snapshots, artifacts, manifests, evidence or iteration log "
                                    "hold the text (needed where it is in anything but a "
                                    "format-2 event payload, snapshot state or iteration)"),
    resume: str = typer.Option("", "--resume", help="carry out a recorded erasure again "
                               "(after a service was down or a run was interrupted; a failure "
                               "names the erasure to resume); it cannot tell what is left of a "
                               "--match text: run the first command with --dry-run for that"),
    fleet: str = typer.Option("", "--fleet", help="fleet (default: your token's fleet)"),
    reason: str = typer.Option("", "--reason", help="why, recorded in governance's chain"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be erased; change "
                                 "nothing"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Erase records (and with --run or --agent whole runs; with --match or --agent single
    events, snapshots and iterations of kept runs): their content, tags, metadata and what
    derives from them (full-text terms, vectors, the search index, compaction summaries
    quoting them, a run's events, snapshots, artifacts and iteration log) leave every store;
    tombstones keep the leaf hashes so chains still verify. The erasure is a chained
    governance event. Governor or admin role. Exits 3 when what it could erase is erased but
    the text is left where only erasing whole runs removes it (runs_holding_text: use
    --whole-runs or --run; format1_events_left: --run); 1 for a bad command line, 2 when a
    call was refused or failed."""
    chosen = [(k, v) for k, v in (("agent", agent), ("record", record), ("run", run),
                                  ("match", match), ("resume", resume)) if v]
    if len(chosen) != 1:
        raise fail("give exactly one of --agent, --record, --run, --match or --resume")
    kind, value = chosen[0]
    if whole_runs and kind != "match":
        raise fail("--whole-runs goes with --match (--run and --agent erase whole runs anyway)")
    services = _Services()
    erasures: list[dict[str, Any]] = []
    left: list[str] = []
    legacy: list[str] = []
    listed: list[gpb.ErasedItem] = []
    old_records, old_manifests = services.format1_records, services.format1_manifests
    try:
        with rpc_errors(as_json):
            if kind == "resume":
                recorded = services.governance.erasure(value)
                erasures.append(_carried_out(services, value, {i.kind for i in recorded.items}))
            elif kind == "match":
                listed, left = _erase_matching(
                    services, value, fleet, reason, dry_run, erasures, as_json, whole_runs)
            else:
                runs: list[gpb.ErasedItem] = []
                if kind == "agent":
                    with status_line(f"listing the runs and events of agent {value} in every "
                                     "run of the fleet…", as_json):
                        runs, legacy = services.agent_run_items(value)
                listed = _erase(services, kind, value, fleet, reason, dry_run, erasures,
                                as_json, runs)
    finally:
        services.close()
    if dry_run:
        items = [{"kind": i.kind, "id": i.id, "leaf_hash": i.leaf_hash} for i in listed]
        if as_json:
            emit_json({"dry_run": True, "would_erase": items, "runs_holding_text": left,
                       "format1_events_left": legacy, "format1_records": list(old_records),
                       "format1_manifests": list(old_manifests)})
        else:
            for item in items:
                console.print(f"{item['kind']} {item['id']}")
            console.print(f"{len(items)} item(s) would be erased")
            _warn_left(left, legacy, [*old_records, *old_manifests])
        return
    total = sum(len(e["records"]) for e in erasures)
    events, snapshots, manifests, evidence, iterations = (
        sum(e.get(f"{what}_erased", 0) for e in erasures)
        for what in ("events", "snapshots", "manifests", "evidence", "iterations"))
    # --resume cannot tell what is left: the text is recorded nowhere (null, not "nothing").
    known = kind != "resume"
    summary = {"erased": total, "events_erased": events, "snapshots_erased": snapshots,
               "manifests_erased": manifests, "evidence_erased": evidence,
               "iterations_erased": iterations,
               "erasures": erasures, "runs_holding_text": left if known else None,
               "format1_events_left": legacy if known else None,
               "format1_records": list(old_records),
               "format1_manifests": list(old_manifests)}
    if as_json:
        emit_json(summary)
    else:
        if not erasures:  # "nothing matches" only when no run holds the text either
            console.print("nothing erased" if left or legacy else
                          "nothing matches: nothing erased")
        else:
            console.print(f"{total} record(s), {events} event(s), {snapshots} snapshot(s), "
                          f"{iterations} iteration(s), {manifests} manifest(s) and {evidence} "
                          f"evidence item(s) erased in {len(erasures)} erasure(s)")
        _warn_left(left, legacy, [*old_records, *old_manifests])
    if left or legacy:  # a script must not take "the text is gone" from exit status 0
        raise typer.Exit(LEFT_EXIT)


def _warn_left(left: list[str], legacy: list[str], derived: list[str]) -> None:
    if left:
        err_console.print(f"[yellow]{len(left)} run(s) still hold the text where only "
                          "erasing the whole run removes it (metadata, stop reason, event "
                          "types, format-1 events, snapshots or iterations, manifests, "
                          f"artifacts or evidence): {', '.join(left[:10])}"
                          f"{' …' if len(left) > 10 else ''}; erase them whole with "
                          "--whole-runs (or --run)[/yellow]")
    if legacy:
        err_console.print(f"[yellow]{len(legacy)} format-1 event(s) of the agent in other "
                          f"agents' runs were not erased: {', '.join(legacy[:10])}"
                          f"{' …' if len(legacy) > 10 else ''}; their hashes cover their "
                          "payloads, so only erasing their whole run (--run) removes "
                          "them[/yellow]")
    if derived:
        err_console.print(f"[yellow]{len(derived)} record(s) or manifest(s) stored before "
                          f"format 2 ({', '.join(derived[:10])}{' …' if len(derived) > 10 else ''}"
                          "): their content goes, but their ids and hashes derive from it, so "
                          "a guess of the exact text can be checked against what is left; "
                          "moving the fleet to a fresh instance with engram import-bundle "
                          "--reissue-ids re-addresses the records (docs/bundle.md)[/yellow]")


def _erase_matching(services: _Services, text: str, fleet: str, reason: str, dry_run: bool,
                    erasures: list[dict[str, Any]], as_json: bool,
                    whole_runs: bool) -> tuple[list[gpb.ErasedItem], list[str]]:
    """``--match``: find every run holding the text (every page of FindRuns and
    FindIterationLogs), then erase the records matching it and what the finds listed (in as
    many erasures as it takes): the events and snapshots holding it in place, or with
    ``whole_runs`` the runs holding it whole. Returns what the (last) round listed (with
    ``dry_run``, everything) and the runs still holding the text where only erasing the
    whole run removes it (none with ``whole_runs``)."""
    holding = services.runs_holding(text, as_json)
    runs = ([i for r in holding.runs for i in services.run_items(r)] if whole_runs
            else holding.items) + holding.loose
    listed = _erase(services, "match", text, fleet, reason, dry_run, erasures, as_json, runs)
    return listed, [] if whole_runs else holding.whole


def _erase(services: _Services, kind: str, value: str, fleet: str, reason: str, dry_run: bool,
           erasures: list[dict[str, Any]], as_json: bool,
           runs: list[gpb.ErasedItem]) -> list[gpb.ErasedItem]:
    """Rounds of select, record, carry out; with ``dry_run`` every page of the selection
    and every run, event and snapshot item, nothing erased. The run, event and snapshot items
    ride in the erasures, at most half of one each; the records (and the summaries quoting
    them, which the shard counts in its limit) take what is left of it. Returns what the last
    round listed (with ``dry_run``, everything)."""
    selector = {"agent": "agent_id", "record": "record_id", "run": "run_id",
                "match": "match"}[kind]
    pending = services.run_items(value) if kind == "run" else list(runs)
    if dry_run:
        return _every_selected(services, selector, value, fleet, as_json) + pending
    while True:
        extra, pending = pending[:EXTRA_PER_ROUND], pending[EXTRA_PER_ROUND:]
        selection = services.shard.forget(**{selector: value}, fleet_id=fleet,
                                          limit=ROUND - len(extra))
        services.selected(selection.records)
        listed = [_record_item(r) for r in selection.records] + extra
        if not listed:
            return listed
        recorded = services.governance.record_erasure(
            kind, "" if kind == "match" else value, listed, reason=reason, fleet_id=fleet,
            request_id=uuid.uuid4().hex).erasure
        done = _carried_out(services, recorded.erasure_id, {i.kind for i in listed})
        done["chain_seq"] = recorded.chain_seq
        erasures.append(done)
        if not as_json:
            err_console.print(f"erasure {recorded.erasure_id} (chain entry "
                              f"{recorded.chain_seq}): {len(done['records'])} record(s) erased")
        if not pending and (not selection.more or not done["records"]):
            return listed


def _carried_out(services: _Services, erasure_id: str, kinds: set[str]) -> dict[str, Any]:
    """:meth:`_Services.carry_out`; a failure names the erasure, which governance recorded
    already, and how to finish it (``engram gov erasures`` lists them too)."""
    try:
        return services.carry_out(erasure_id, kinds)
    except EngramRpcError as error:
        raise EngramRpcError(
            error.code, f"{error.message}; erasure {erasure_id} is recorded but not carried out "
            f"everywhere: finish it with `engram forget --resume {erasure_id}`", error.reason,
            {**error.metadata, "erasure_id": erasure_id}, error.retry_delay) from error
    except KeyboardInterrupt:  # Ctrl-C: exit 130 as before, with the id to resume
        raise fail(f"interrupted: erasure {erasure_id} is recorded but maybe not carried out "
                   f"everywhere: finish it with `engram forget --resume {erasure_id}`",
                   code=130) from None


def _every_selected(services: _Services, selector: str, value: str, fleet: str,
                    as_json: bool) -> list[gpb.ErasedItem]:
    """Every page of the shard's selection (a dry run: nothing erased between pages), each
    summary once however many pages' records it quotes."""
    pages = _every_page(lambda token: services.shard.forget(
        **{selector: value}, fleet_id=fleet, limit=ROUND, page_token=token),
        "the records selected", as_json)
    for page in pages:
        services.selected(page.records)
    return list({(r.kind, r.record_id): _record_item(r)
                 for page in pages for r in page.records}.values())


def _record_item(record: spb.ForgottenRecord) -> gpb.ErasedItem:
    """A record (or summary) the shard selected, as governance's erasure lists it."""
    return gpb.ErasedItem(kind=record.kind, id=record.record_id, leaf_hash=record.record_hash)


def register(app: typer.Typer) -> None:
    app.command("forget")(forget)
