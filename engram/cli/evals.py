"""`engram eval locomo`: evidence recall of search on LoCoMo conversations, through the services.

Each conversation becomes one fleet (a token minted with the deployment's
signing key, hence the server extra), each session one run, each turn one
memory ``"{speaker}: {text}"`` with its session date as metadata, written in
batches through the running shard (and its governance gate). Then every
question with evidence is asked and the share of its evidence turns in the top
k is averaged.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import typer
from rich.progress import Progress

from engram.cli._output import (
    JSON_OPTION,
    console,
    emit_json,
    fail,
    rpc_errors,
    server_extra,
    settings,
    with_client,
)
from engram.cli.token import load_signer
from engram.client import ShardClient
from engram.client._errors import EngramRpcError
from engram.client.shard import record_input
from engram.eval.locomo import Conversation, RecallReport, load_conversation
from engram.shard.v1 import shard_service_pb2 as pb

app = typer.Typer(help="Evaluate retrieval quality against public benchmarks.",
                  no_args_is_help=True)

_BATCH = 100


def _client_for(token: str) -> ShardClient:
    return with_client(
        lambda s: ShardClient(s.shard_addr, token, **s.tls(), timeout=s.timeout_seconds)
    )


def _load(client: ShardClient, conv: Conversation) -> tuple[dict[str, list[str]], int]:
    """Write the turns; returns record id -> dia ids (a deduplicated turn maps to the kept one)."""
    dia_of: dict[str, list[str]] = {}
    denied = 0
    inputs = [
        (turn.dia_id, record_input(
            turn.memory_text(), run_id=f"session-{turn.session}",
            metadata={"session_date": turn.session_date, "dia_id": turn.dia_id,
                      "speaker": turn.speaker}))
        for turn in conv.turns
    ]
    for start in range(0, len(inputs), _BATCH):
        chunk = inputs[start : start + _BATCH]
        responses: list[pb.CreateRecordResponse | None]
        try:
            responses = list(client.add_many([m for _, m in chunk]).results)
        except EngramRpcError as error:
            if error.reason != "GATE_DENIED":
                raise
            responses = []
            for _, message in chunk:  # the gate refused one; keep the others
                try:
                    responses.append(client.add_many([message]).results[0])
                except EngramRpcError as single:
                    if single.reason != "GATE_DENIED":
                        raise
                    responses.append(None)
                    denied += 1
        for (dia_id, _), response in zip(chunk, responses, strict=True):
            if response is not None:
                dia_of.setdefault(response.record.id, []).append(dia_id)
    return dia_of, denied


def _ask(client: ShardClient, conv: Conversation, dia_of: dict[str, list[str]],
         report: RecallReport, mode: str, depth: int) -> None:
    for question in conv.questions:
        start = time.perf_counter()
        hits = client.search(question.text, limit=depth, mode=mode)
        elapsed = (time.perf_counter() - start) * 1000
        ranked = [dia for hit in hits for dia in dia_of.get(hit.record.id, [])]
        report.add(question, ranked, elapsed)


def _wait_indexed(client: ShardClient, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.status().indexing_lag and time.monotonic() < deadline:
        time.sleep(0.2)


@app.command("locomo")
def locomo(
    files: list[Path] = typer.Argument(..., help="LoCoMo conversation JSON files"),
    k: str = typer.Option("5,10", "--k", help="comma-separated cut-offs for recall@k"),
    mode: str = typer.Option("hybrid", "--mode", help="lexical, semantic or hybrid"),
    fleet_prefix: str = typer.Option(
        "", help="fleet name prefix (default: a fresh locomo-<id>- so runs do not mix)"),
    key: Path | None = typer.Option(None, "--key", help="signing key (default: home/auth)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Load each conversation as one fleet through the running shard, ask every question with
    evidence, and print evidence recall@k (overall and per category) and search p50/p95."""
    if mode not in ("lexical", "semantic", "hybrid"):
        raise fail("--mode must be lexical, semantic or hybrid")
    try:
        ks = tuple(sorted({int(part) for part in k.split(",") if part.strip()}))
    except ValueError:
        raise fail(f"--k must be comma-separated integers, got {k!r}") from None
    if not ks or ks[0] < 1 or ks[-1] > 100:
        raise fail("--k values must be within 1..100")
    with server_extra("eval locomo"):
        from services.common.tokens import key_paths
    signer = load_signer(key or key_paths(settings().home).private)
    try:
        convs = [load_conversation(path) for path in files]
    except (OSError, ValueError, KeyError) as error:
        raise fail(f"cannot read conversation: {error}") from None
    prefix = fleet_prefix or f"locomo-{uuid.uuid4().hex[:8]}-"
    report = RecallReport(ks=ks)
    denied = 0
    with rpc_errors(as_json), Progress(console=console, disable=as_json,
                                       transient=True) as progress:
        task = progress.add_task("loading", total=len(convs) * 2)
        loaded = []
        for conv in convs:
            client = _client_for(signer.issue("locomo-loader", prefix + conv.name, {"agent"}))
            dia_of, refused = _load(client, conv)
            denied += refused
            loaded.append((client, conv, dia_of))
            progress.advance(task)
        progress.update(task, description="indexing")
        for client, _, _ in loaded:
            _wait_indexed(client)
        progress.update(task, description="asking")
        for client, conv, dia_of in loaded:
            _ask(client, conv, dia_of, report, mode, ks[-1])
            progress.advance(task)
    figures = {"mode": mode, "conversations": len(convs), "denied_writes": denied,
               **report.as_dict()}
    if as_json:
        emit_json(figures)
        return
    for name, value in figures.items():
        if name != "categories":
            console.print(f"{name:>16}  {value}")
    for category, values in figures["categories"].items():  # type: ignore[attr-defined]
        console.print(f"{category:>16}  {values}")
