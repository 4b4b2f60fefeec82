"""The MCP server's tools against fake clients, in process: tokens, errors, filters, and
the verify path for a tampered run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest

if not os.environ.get("CI"):  # in CI (CI=true) the missing extra fails the import below
    pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'engram[mcp]'")

from mcp import Client
from mcp_types import CallToolResult

from engram.client import ClientSettings, EngramRpcError
from engram.mcp_server import (
    BearerHeader,
    FixedToken,
    RecallFilters,
    TokenSource,
    build_mcp_server,
    error_text,
    search_filter_names,
)
from engram.shard.v1 import shard_service_pb2 as pb


class FakeShard:
    def __init__(self, token: str, calls: list[tuple[str, str, dict[str, Any]]],
                 tampered: bool = False) -> None:
        self.token, self.calls, self.tampered = token, calls, tampered

    def search(self, query: str, **kwargs: Any) -> list[pb.SearchHit]:
        self.calls.append((self.token, "search", {"query": query, **kwargs}))
        return [pb.SearchHit(record=pb.Record(id="r1", content=query), score=0.5, via="direct")]

    def snapshot(self, run_id: str, *, verify: bool = True) -> Iterator[pb.Record]:
        self.calls.append((self.token, "snapshot", {"run_id": run_id, "verify": verify}))
        yield pb.Record(id="r1")
        if self.tampered and verify:
            raise EngramRpcError(grpc.StatusCode.DATA_LOSS, "record r2 fails its hash",
                                 "RECORD_TAMPERED", {"record_id": "r2"})
        yield pb.Record(id="r2")

    def verify(self, ids: Sequence[str] = ()) -> pb.VerifyRecordsResponse:
        self.calls.append((self.token, "verify", {"ids": list(ids)}))
        return pb.VerifyRecordsResponse(checked=len(ids), failures=[pb.IntegrityFailure(
            id="r2", expected_hash="aa", actual_hash="bb", detail="content hash mismatch")])


class FakeBackends:
    def __init__(self, tampered: bool = False) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.tampered = tampered

    def shard(self, token: str) -> FakeShard:
        return FakeShard(token, self.calls, self.tampered)

    def artifacts(self, token: str) -> Any:
        raise AssertionError("not used")


def call(backends: FakeBackends, tokens: TokenSource, name: str,
         arguments: dict[str, Any]) -> CallToolResult:
    server = build_mcp_server(backends, tokens)  # type: ignore[arg-type]

    async def main() -> CallToolResult:
        async with Client(server) as client:
            return await client.call_tool(name, arguments)

    return anyio.run(main)


def text(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.parametrize("headers", [None, {}, {"authorization": ""},
                                     {"authorization": "Basic dXNlcjpwdw=="},
                                     {"authorization": "Bearer "}])
def test_http_callers_without_a_bearer_token_are_unauthenticated(
        headers: dict[str, str] | None) -> None:
    with pytest.raises(EngramRpcError) as caught:
        BearerHeader().token(headers)
    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.reason == "TOKEN_MISSING"


@pytest.mark.parametrize("value", ["Bearer \xff\xfe", "Bearer tok\x00en", "Bearer \u00e9t\u00e9",
                                   "Bearer " + "a" * 12_000])
def test_a_header_grpc_cannot_carry_or_longer_than_a_token_is_malformed(value: str) -> None:
    """Found by a review (2026-11-29): a non-ASCII token reached the channel and came back
    INTERNAL "Invalid metadata"; a 12 KB one RESOURCE_EXHAUSTED naming gRPC's metadata sizes."""
    with pytest.raises(EngramRpcError) as caught:
        BearerHeader().token({"Authorization": value})
    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.reason == "TOKEN_MALFORMED"


def test_http_callers_are_their_bearer_token_and_stdio_is_the_servers() -> None:
    assert BearerHeader().token({"Authorization": "bearer  tok-1 "}) == "tok-1"
    assert FixedToken("env-token").token({"authorization": "Bearer other"}) == "env-token"


def test_a_tool_call_without_a_token_never_reaches_the_services() -> None:
    backends = FakeBackends()
    result = call(backends, BearerHeader(), "recall", {"query": "x"})
    assert result.is_error
    assert "UNAUTHENTICATED" in text(result) and "[TOKEN_MISSING]" in text(result)
    assert backends.calls == []


def test_recall_filters_are_exactly_the_sdks_search_filters() -> None:
    """When ShardClient.search gains a filter (metadata, author, dates...), RecallFilters
    must gain the same field, so the tool passes it through."""
    assert set(RecallFilters.model_fields) == search_filter_names()


def test_recall_passes_its_arguments_and_filters_to_the_sdk() -> None:
    backends = FakeBackends()
    result = call(backends, FixedToken("tok"), "recall", {
        "query": "q", "mode": "semantic", "limit": 3, "run": "r", "domain": "people",
        "cross": True, "filters": {"tags": ["a", "b"]}})
    assert not result.is_error, text(result)
    assert backends.calls == [("tok", "search", {
        "query": "q", "limit": 3, "run_id": "r", "domain": "people", "cross": True,
        "mode": "semantic", "tags": ["a", "b"]})]
    unknown = call(backends, FixedToken("tok"), "recall",
                   {"query": "q", "filters": {"colour": "red"}})
    assert unknown.is_error and "colour" in text(unknown)


def test_recall_passes_every_filter_kind_to_the_sdk() -> None:
    backends = FakeBackends()
    filters = {"tags": ["a"], "tags_any": ["b", "c"], "metadata": {"project": "x", "env": "p"},
               "author": "agent-7", "created_after": "2026-01-01T00:00:00Z",
               "created_before": "2026-02-01T00:00:00+01:00", "min_importance": 0.4}
    result = call(backends, FixedToken("tok"), "recall", {"query": "q", "filters": filters})
    assert not result.is_error, text(result)
    assert backends.calls == [("tok", "search", {
        "query": "q", "limit": 10, "run_id": None, "domain": "", "cross": False,
        "mode": "hybrid", **filters})]


@pytest.mark.parametrize("bad", [{"min_importance": 1.5}, {"min_importance": -0.1},
                                 {"metadata": {"k": 1}}, {"tags_any": "a"}])
def test_recall_refuses_bad_filters_before_calling(bad: dict[str, Any]) -> None:
    backends = FakeBackends()
    result = call(backends, FixedToken("tok"), "recall", {"query": "q", "filters": bad})
    assert result.is_error
    assert backends.calls == []


def test_verify_run_reports_every_tampered_record() -> None:
    clean = call(FakeBackends(), FixedToken("tok"), "verify_run", {"run": "run-1"})
    assert clean.structured_content == {"run_id": "run-1", "checked": 2, "ok": True,
                                        "failures": []}
    backends = FakeBackends(tampered=True)
    result = call(backends, FixedToken("tok"), "verify_run", {"run": "run-1"})
    assert not result.is_error, text(result)
    assert result.structured_content == {
        "run_id": "run-1", "checked": 2, "ok": False,
        "failures": [{"id": "r2", "expected_hash": "aa", "actual_hash": "bb",
                      "detail": "content hash mismatch", "reason": "", "erasure_id": ""}]}
    assert [c[1] for c in backends.calls] == ["snapshot", "snapshot", "verify"]


def test_error_text_carries_status_message_reason_and_metadata() -> None:
    error = EngramRpcError(grpc.StatusCode.PERMISSION_DENIED, "denied by rule",
                           "GATE_DENIED", {"rule_ids": "r1,r2"})
    assert error_text(error) == "PERMISSION_DENIED: denied by rule [GATE_DENIED] (rule_ids=r1,r2)"


def test_stdio_without_any_token_says_how_to_get_one(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from engram.cli.main import app

    monkeypatch.setattr("engram.cli._output._settings",
                        ClientSettings({"ENGRAM_HOME": str(tmp_path)}))
    done = CliRunner().invoke(app, ["mcp"])
    assert done.exit_code == 1 and "no token: set ENGRAM_TOKEN" in done.output, done.output
    bad = CliRunner().invoke(app, ["mcp", "--transport", "sse"])
    assert bad.exit_code == 2 and "stdio or http" in bad.output, bad.output


def test_without_the_extra_engram_mcp_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from engram.cli.main import app

    for name in [m for m in sys.modules if m == "engram.mcp_server"
                 or m.startswith("engram.mcp_server.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)
    result = CliRunner().invoke(app, ["mcp"])
    assert result.exit_code == 1
    assert "needs the mcp extra: pip install 'engram[mcp]'" in result.output
