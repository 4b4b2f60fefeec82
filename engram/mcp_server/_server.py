"""The MCP server: Engram's memory and run tools on the official ``mcp`` SDK (``MCPServer``).

Every tool calls the services through the Python SDK with the caller's token (see
``_backends``); a failed call comes back as a tool error (``isError``) whose text is the
gRPC status, the message and the ErrorInfo reason, as the CLI prints them.

Bounds the services check are published in the schemas (``minimum`` / ``maximum``) but not
enforced here: an out-of-range value gets the services' own status and reason
(``INVALID_ARGUMENT ... [IMPORTANCE_OUT_OF_RANGE]``), the same over every interface.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from typing import Annotated, Any, Literal

import grpc
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from engram.cli._output import message_dict
from engram.client import EngramRpcError, ShardClient
from engram.mcp_server._backends import Backends, TokenSource

INSTRUCTIONS = """\
Engram is durable, verifiable memory shared by a fleet of agents. Use `recall` before you \
decide or act, to find what you or other agents already learned; use `remember` to store \
what is worth knowing later (a lesson, a decision, a fact about a person or project), one \
self-contained statement per memory. Memories are immutable and content-addressed: \
remembering the same thing twice returns the same id. Runs group the work of one task: \
`start_run`, write memories and `append_event` with that run id, then `stop_run`; \
`verify_run` re-hashes every memory of a run to prove it was not altered. Every call acts \
as the caller's token: its fleet, its trust tier and the governance rules apply, and a \
refused write names the rule that refused it."""

SearchMode = Literal["hybrid", "lexical", "semantic"]
StopStatus = Literal["succeeded", "failed", "cancelled"]

RunId = Annotated[str, Field(
    description="Run id: letters, digits and - _ . : @ (as returned by start_run).")]
OptionalRun = Annotated[str | None, Field(
    description="Only memories written in this run; omit for every run of the fleet.")]
Domain = Annotated[str, Field(
    description="Domain (shard) such as projects, insights, people, technical, strategy; "
    "empty: routed by keywords on write, every domain on read.")]
Tags = Annotated[Sequence[str], Field(description="Short labels, e.g. [\"ops\", \"incident\"].")]


class RecallFilters(BaseModel):
    """Filters on the memories `recall` may return; every field is optional and they combine
    with AND. Each field is a keyword argument of ``ShardClient.search``, passed as is."""

    model_config = ConfigDict(extra="forbid")

    tags: list[str] = Field(default_factory=list,
                            description="Only memories carrying all of these tags.")
    tags_any: list[str] = Field(default_factory=list,
                                description="Only memories carrying at least one of these tags.")
    metadata: dict[str, str] = Field(
        default_factory=dict, description="Only memories whose metadata has every one of these "
        "key = value pairs.")
    author: str = Field(default="", description="Only memories written by this agent id.")
    created_after: str | None = Field(
        default=None, description="Only memories created after this RFC 3339 time, e.g. "
        "2026-05-01T12:00:00Z.")
    created_before: str | None = Field(
        default=None, description="Only memories created before this RFC 3339 time.")
    min_importance: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Only memories of at least this importance (0..1).")

    def search_kwargs(self) -> dict[str, Any]:
        return self.model_dump(exclude_defaults=True)


VERIFY_PART = 500
"""Record ids a verify_run sends in one VerifyRecords (the shard takes up to its
ENGRAM_LIMITS_BATCH_ITEMS, 1,000 by default)."""
RECALL_ARGUMENTS = frozenset({"query", "limit", "run_id", "domain", "cross", "mode"})
"""``ShardClient.search`` parameters that `recall` takes as its own arguments; every other
parameter is a filter and must be a field of ``RecallFilters`` (a unit test checks it)."""


def search_filter_names() -> set[str]:
    """The filter parameters ``ShardClient.search`` accepts today."""
    return set(inspect.signature(ShardClient.search).parameters) - RECALL_ARGUMENTS - {"self"}


def error_text(error: EngramRpcError) -> str:
    """``CODE: message [REASON]`` and any ErrorInfo metadata (a denial's rule ids)."""
    extra = ", ".join(f"{key}={value}" for key, value in sorted(error.metadata.items()))
    return str(error) + (f" ({extra})" if extra else "")


@contextmanager
def _tool_errors() -> Iterator[None]:
    try:
        yield
    except EngramRpcError as error:
        raise ToolError(error_text(error)) from None
    except ValueError as error:  # refused by the SDK before sending (a malformed time)
        raise ToolError(f"INVALID_ARGUMENT: {error} [INVALID_FILTER]") from None


def build_mcp_server(backends: Backends, tokens: TokenSource) -> MCPServer:
    """The server with its tools; ``tokens`` says whose token each call carries."""
    server: MCPServer = MCPServer("engram", instructions=INSTRUCTIONS, version="0.1.0")

    def caller(ctx: Context) -> str:
        with _tool_errors():
            return tokens.token(ctx.headers)

    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                             idempotent_hint=True, open_world_hint=False)
    # A second call adds a second event (unless it repeats a request_id) or fails (stop).
    appends = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                              idempotent_hint=False, open_world_hint=False)

    @server.tool(title="Remember", annotations=writes)
    def remember(
        ctx: Context,
        content: Annotated[str, Field(
            description="The memory: one self-contained fact, decision, lesson or "
            "observation, in plain text. `shard:<id>` or `see shard <domain>` in it links "
            "to another memory or domain.")],
        run: Annotated[str, Field(
            description="Run this memory belongs to (see start_run); empty: no run.")] = "",
        tags: Tags = (),
        metadata: Annotated[dict[str, str] | None, Field(
            description="String key/value pairs stored with the memory.")] = None,
        importance: Annotated[float, Field(
            description="0 (trivia) to 1 (critical), default 0.5: ranks recall; memories "
            "below 0.3 may be summarised by compaction.",
            json_schema_extra={"minimum": 0, "maximum": 1})] = 0.5,
        domain: Domain = "",
        source: Annotated[str, Field(
            description="Where it came from (a URL, a file, a tool name).")] = "",
        request_id: Annotated[str, Field(
            description="Optional idempotency key: a retry with the same key returns the "
            "first result.")] = "",
    ) -> dict[str, Any]:
        """Store a memory in Engram (immutable, content-addressed, checked by governance).

        Returns the stored record with its id, whether it was new (`created`), and
        `duplicate_of` when it repeats an existing memory."""
        token = caller(ctx)
        with _tool_errors():
            written = backends.shard(token).add(
                content, run_id=run, domain=domain, source=source, importance=importance,
                tags=tags, metadata=metadata, request_id=request_id)
        return {"record": message_dict(written.record), "created": written.created,
                "duplicate_of": written.duplicate_of}

    @server.tool(title="Recall", annotations=read_only)
    def recall(
        ctx: Context,
        query: Annotated[str, Field(description="What to look for, in natural language or "
                                    "keywords.")],
        mode: Annotated[SearchMode, Field(
            description="hybrid (default): keywords and meaning fused; lexical: exact "
            "words; semantic: meaning only.")] = "hybrid",
        limit: Annotated[int, Field(description="Most memories to return (1..100).",
                                    json_schema_extra={"minimum": 1, "maximum": 100})] = 10,
        run: OptionalRun = None,
        domain: Domain = "",
        cross: Annotated[bool, Field(
            description="Also return memories linked from the hits by cross-references.")]
            = False,
        filters: Annotated[RecallFilters | None, Field(
            description="Optional filters; all must match.")] = None,
    ) -> dict[str, Any]:
        """Search the fleet's memories, best first.

        Scores fuse relevance with the author's trust, the memory's importance and its age;
        `via` is "direct" or "cross_ref". Memories of suspended agents never appear."""
        token = caller(ctx)
        with _tool_errors():
            hits = backends.shard(token).search(
                query, limit=limit, run_id=run, domain=domain, cross=cross, mode=mode,
                **(filters or RecallFilters()).search_kwargs())
        return {"count": len(hits),
                "hits": [{"score": hit.score, "via": hit.via, "record": message_dict(hit.record)}
                         for hit in hits]}

    @server.tool(title="Get memory", annotations=read_only)
    def get_memory(
        ctx: Context,
        id: Annotated[str, Field(description="The memory's id (from remember or recall).")],
    ) -> dict[str, Any]:
        """One memory by id, with its hashes, author, run, tags and cross-references."""
        token = caller(ctx)
        with _tool_errors():
            return message_dict(backends.shard(token).get(id))

    @server.tool(title="List a run's memories", annotations=read_only)
    def list_run(
        ctx: Context,
        run: RunId,
        limit: Annotated[int, Field(description="Most memories to return (1..1000).",
                                    json_schema_extra={"minimum": 1, "maximum": 1000})] = 50,
        tags: Tags = (),
        domain: Domain = "",
    ) -> dict[str, Any]:
        """The memories written in one run, newest first; `truncated` says more exist."""
        token = caller(ctx)
        if not 1 <= limit <= 1000:
            raise ToolError(f"INVALID_ARGUMENT: limit must be 1..1000, got {limit} "
                            "[LIMIT_OUT_OF_RANGE]")
        with _tool_errors():
            page = list(islice(backends.shard(token).list(
                run_id=run, tags=tags, domain=domain, page_size=min(limit + 1, 1000)), limit + 1))
        return {"run_id": run, "count": min(len(page), limit), "truncated": len(page) > limit,
                "records": [message_dict(record) for record in page[:limit]]}

    @server.tool(title="Verify a run", annotations=read_only)
    def verify_run(ctx: Context, run: RunId) -> dict[str, Any]:
        """Re-hash every memory of a run (SnapshotForRun with verify) to prove none was
        altered. `ok` is false and `failures` names each memory whose hashes do not match."""
        token = caller(ctx)
        shard = backends.shard(token)
        with _tool_errors():
            try:
                checked = sum(1 for _ in shard.snapshot(run, verify=True))
                return {"run_id": run, "checked": checked, "ok": True, "failures": []}
            except EngramRpcError as error:
                if error.code != grpc.StatusCode.DATA_LOSS:
                    raise
                tampered = error
            # The snapshot stops at the first bad record; VerifyRecords reports them all, in
            # parts the shard takes (a run may hold more than one call's ids).
            ids = (record.id for record in shard.snapshot(run, verify=False))
            checked = 0
            found: list[Any] = []
            while part := list(islice(ids, VERIFY_PART)):
                report = shard.verify(part)
                checked += report.checked
                found.extend(report.failures)
        failures = [message_dict(failure) for failure in found] or [
            {"id": tampered.metadata.get("record_id", ""), "detail": error_text(tampered)}]
        return {"run_id": run, "checked": checked, "ok": False, "failures": failures}

    @server.tool(title="Start a run", annotations=writes)
    def start_run(
        ctx: Context,
        run: Annotated[str, Field(
            description="Run id to use (letters, digits and - _ . : @); empty: one is "
            "generated. Starting an existing run returns it unchanged.")] = "",
        metadata: Annotated[dict[str, Any] | None, Field(
            description="Any JSON object describing the run (task, model, inputs).")] = None,
    ) -> dict[str, Any]:
        """Start a run: the unit of work whose memories, events and snapshots belong
        together. Returns the run (`run_id`, `status`, ...) and whether it was new."""
        token = caller(ctx)
        with _tool_errors():
            started = backends.artifacts(token).start_run(run, metadata)
        return {"run": message_dict(started.run), "created": started.created}

    @server.tool(title="Stop a run", annotations=appends)
    def stop_run(
        ctx: Context,
        run: RunId,
        status: Annotated[StopStatus, Field(description="How the run ended.")] = "succeeded",
        reason: Annotated[str, Field(description="Why, in a sentence.")] = "",
    ) -> dict[str, Any]:
        """Stop a run with its final status; a stopped run takes no more events."""
        token = caller(ctx)
        with _tool_errors():
            return message_dict(backends.artifacts(token).stop_run(run, status, reason))

    @server.tool(title="Append an event", annotations=appends)
    def append_event(
        ctx: Context,
        run: RunId,
        type: Annotated[str, Field(
            description="Event type, dotted, e.g. tool.called, plan.updated, step.done.")],
        payload: Annotated[dict[str, Any] | None, Field(
            description="A JSON object with the event's details (at most 60 KiB).")] = None,
        request_id: Annotated[str, Field(
            description="Optional idempotency key: a retry with the same key returns the "
            "first event.")] = "",
    ) -> dict[str, Any]:
        """Append an event to a run's hash-chained log (replayable with the run)."""
        token = caller(ctx)
        with _tool_errors():
            appended = backends.artifacts(token).append_event(run, type, payload,
                                                              request_id=request_id)
        return {"event": message_dict(appended.event), "created": appended.created}

    return server


TOOL_NAMES = ("remember", "recall", "get_memory", "list_run", "verify_run", "start_run",
              "stop_run", "append_event")

__all__ = ["TOOL_NAMES", "RecallFilters", "build_mcp_server", "error_text", "search_filter_names"]
