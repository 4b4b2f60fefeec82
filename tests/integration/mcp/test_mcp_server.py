"""`engram mcp` over stdio and streamable HTTP, driven by the mcp SDK's client against a
running governance + shard + artifacts: the tools, their schemas, their errors, and the
caller's token deciding what each call may see and do."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

if not os.environ.get("CI"):  # in CI (CI=true) the missing extra fails the import below
    pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'engram[mcp]'")

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp_types import CallToolResult

from engram.client import GovernanceClient
from engram.mcp_server import TOOL_NAMES
from tests.integration.mcp.conftest import Stack

Scenario = Callable[[Client], Awaitable[None]]


def over_stdio(stack: Stack, token: str, scenario: Scenario) -> None:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "engram.cli.main", "mcp"],
                                   env=stack.env(token), cwd=str(stack.home))

    async def main() -> None:
        async with Client(params) as client:
            await scenario(client)

    anyio.run(main)


def over_http(url: str, token: str | None, scenario: Scenario) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def main() -> None:
        async with (create_mcp_http_client(headers=headers) as http,
                    Client(streamable_http_client(url, http_client=http)) as client):
            await scenario(client)

    anyio.run(main)


def ok(result: CallToolResult) -> dict[str, Any]:
    text = " ".join(getattr(block, "text", "") for block in result.content)
    assert not result.is_error, text
    assert result.structured_content is not None
    assert json.loads(text) == result.structured_content  # the text is the same JSON
    return result.structured_content


def failed(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_tools_and_their_schemas(stack: Stack) -> None:
    async def scenario(client: Client) -> None:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == set(TOOL_NAMES)
        for tool in tools.values():
            assert tool.description and len(tool.description) > 40, tool.name
            for name, prop in tool.input_schema["properties"].items():
                assert prop.get("description"), f"{tool.name}.{name} has no description"
        remember = tools["remember"].input_schema
        assert remember["required"] == ["content"]
        assert (remember["properties"]["importance"]["minimum"],
                remember["properties"]["importance"]["maximum"]) == (0, 1)
        assert remember["properties"]["tags"]["items"] == {"type": "string"}
        recall = tools["recall"].input_schema
        assert recall["properties"]["mode"]["enum"] == ["hybrid", "lexical", "semantic"]
        assert (recall["properties"]["limit"]["minimum"],
                recall["properties"]["limit"]["maximum"]) == (1, 100)
        filters = recall["$defs"]["RecallFilters"]
        assert filters["additionalProperties"] is False and "tags" in filters["properties"]
        assert tools["stop_run"].input_schema["properties"]["status"]["enum"] == [
            "succeeded", "failed", "cancelled"]
        assert tools["recall"].annotations and tools["recall"].annotations.read_only_hint
        assert client.instructions and "recall" in client.instructions

    over_stdio(stack, stack.tokens("agent-1", "fleet-a"), scenario)


def test_remember_recall_get_list_and_verify_a_run(stack: Stack) -> None:
    async def scenario(client: Client) -> None:
        written = ok(await client.call_tool("remember", {
            "content": "Lesson learned: retries need idempotency keys", "run": "mcp-run-1",
            "tags": ["ops"], "metadata": {"ticket": "OPS-7"}, "importance": 0.8,
            "domain": "insights"}))
        record = written["record"]
        assert written["created"] is True and record["agent_id"] == "agent-1"
        assert (record["run_id"], record["tags"], record["metadata"], record["importance"],
                record["domain"]) == ("mcp-run-1", ["ops"], {"ticket": "OPS-7"}, 0.8, "insights")
        again = ok(await client.call_tool("remember", {
            "content": "Lesson learned: retries need idempotency keys", "run": "mcp-run-1",
            "tags": ["ops"], "metadata": {"ticket": "OPS-7"}, "importance": 0.8,
            "domain": "insights"}))
        assert again["record"]["id"] == record["id"] and again["created"] is False
        ok(await client.call_tool("remember", {"content": "Decision: deploy on Tuesdays",
                                               "run": "mcp-run-1"}))

        found = ok(await client.call_tool("recall", {"query": "idempotency keys",
                                                     "mode": "lexical", "limit": 5}))
        assert found["hits"][0]["record"] == record and found["count"] == len(found["hits"])
        assert found["hits"][0]["via"] == "direct" and found["hits"][0]["score"] > 0
        filtered = ok(await client.call_tool("recall", {
            "query": "idempotency keys", "mode": "lexical", "run": "mcp-run-1",
            "domain": "insights", "filters": {"tags": ["not-this-tag"]}}))
        assert filtered["hits"] == []

        got = ok(await client.call_tool("get_memory", {"id": record["id"]}))
        assert got == record
        listed = ok(await client.call_tool("list_run", {"run": "mcp-run-1"}))
        assert listed["count"] == 2 and listed["truncated"] is False
        assert record["id"] in [r["id"] for r in listed["records"]]
        first = ok(await client.call_tool("list_run", {"run": "mcp-run-1", "limit": 1}))
        assert first["count"] == 1 and first["truncated"] is True

        verified = ok(await client.call_tool("verify_run", {"run": "mcp-run-1"}))
        assert verified == {"run_id": "mcp-run-1", "checked": 2, "ok": True, "failures": []}

        missing = failed(await client.call_tool("get_memory", {"id": "0" * 64}))
        assert "NOT_FOUND" in missing

    over_stdio(stack, stack.tokens("agent-1", "fleet-a"), scenario)


def test_a_run_with_events(stack: Stack) -> None:
    async def scenario(client: Client) -> None:
        started = ok(await client.call_tool("start_run", {"run": "mcp-run-2",
                                                          "metadata": {"task": "tests"}}))
        run = started["run"]
        assert started["created"] is True and run["run_id"] == "mcp-run-2"
        assert run["metadata"] == {"task": "tests"} and run["status"] == "RUN_STATUS_RUNNING"
        event = ok(await client.call_tool("append_event", {
            "run": "mcp-run-2", "type": "tool.called", "payload": {"tool": "search"}}))
        assert event["event"]["seq"] == 1 and event["event"]["payload"] == {"tool": "search"}
        stopped = ok(await client.call_tool("stop_run", {"run": "mcp-run-2",
                                                         "status": "succeeded",
                                                         "reason": "done"}))
        assert stopped["status"] == "RUN_STATUS_SUCCEEDED" and stopped["event_count"] >= 1
        generated = ok(await client.call_tool("start_run", {}))
        assert generated["run"]["run_id"]

    over_stdio(stack, stack.tokens("agent-1", "fleet-a"), scenario)


def test_a_bad_input_is_a_tool_error_with_status_and_reason(stack: Stack) -> None:
    async def scenario(client: Client) -> None:
        text = failed(await client.call_tool("remember", {"content": "too important",
                                                          "importance": 3}))
        assert "INVALID_ARGUMENT" in text and "[IMPORTANCE_OUT_OF_RANGE]" in text, text
        text = failed(await client.call_tool("recall", {"query": "x", "limit": 500}))
        assert "INVALID_ARGUMENT" in text and "limit" in text, text
        text = failed(await client.call_tool("recall", {"query": "x", "mode": "fuzzy"}))
        assert "mode" in text, text

    over_stdio(stack, stack.tokens("agent-1", "fleet-a"), scenario)


def test_http_without_a_bearer_token_is_unauthenticated(stack: Stack, http_url: str) -> None:
    async def scenario(client: Client) -> None:
        assert {tool.name for tool in (await client.list_tools()).tools} == set(TOOL_NAMES)
        for name, arguments in (("recall", {"query": "anything"}),
                                ("remember", {"content": "who am I"}),
                                ("start_run", {})):
            text = failed(await client.call_tool(name, arguments))
            assert text.count("UNAUTHENTICATED") == 1 and "[TOKEN_MISSING]" in text, text

    over_http(http_url, None, scenario)


def test_http_acts_as_each_requests_token(stack: Stack, http_url: str) -> None:
    content = "Fleet A secret: the launch code word is marmalade"

    async def fleet_a(client: Client) -> None:
        written = ok(await client.call_tool("remember", {"content": content}))
        assert written["record"]["agent_id"] == "http-a"
        hits = ok(await client.call_tool("recall", {"query": "marmalade", "mode": "lexical"}))
        assert hits["hits"][0]["record"]["content"] == content

    async def fleet_b(client: Client) -> None:
        hits = ok(await client.call_tool("recall", {"query": "marmalade", "mode": "lexical"}))
        assert hits["hits"] == []
        listed = ok(await client.call_tool("list_run", {"run": ""}))
        assert content not in [r["content"] for r in listed["records"]]

    async def forged(client: Client) -> None:
        text = failed(await client.call_tool("recall", {"query": "marmalade"}))
        assert "UNAUTHENTICATED" in text, text

    over_http(http_url, stack.tokens("http-a", "fleet-a"), fleet_a)
    over_http(http_url, stack.tokens("http-b", "fleet-b"), fleet_b)
    over_http(http_url, "not-a-token", forged)


def test_http_writes_pass_the_governance_gate(stack: Stack, http_url: str) -> None:
    with GovernanceClient(stack.governance_addr,
                          stack.tokens("ops", "fleet-a", ("governor",))) as governor:
        governor.set_tier("mallory", "suspended", reason="poisoning")

    async def scenario(client: Client) -> None:
        text = failed(await client.call_tool("remember", {"content": "Payments are disabled"}))
        assert "PERMISSION_DENIED" in text, text

    over_http(http_url, stack.tokens("mallory", "fleet-a"), scenario)


def _closed_while_trickling(url: str, start: bytes, byte: bytes,
                            within: float) -> bytes | None:
    """Open a connection to the server of ``url``, send ``start``, then ``byte`` every few
    tenths of a second: what the server sent before it closed it within ``within`` seconds,
    or None if it did not."""
    import socket
    import time

    host, port = url.removeprefix("http://").split("/")[0].split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(start.replace(b"{port}", port.encode()))
        conn.settimeout(0.3)
        began = time.monotonic()
        while time.monotonic() - began < within:
            try:
                conn.sendall(byte)
                piece = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return answer
            if piece == b"":
                return answer
            answer += piece
    return None


def test_request_headers_that_come_too_slowly_close_the_connection(stack: Stack) -> None:
    """The MCP server's HTTP transport is uvicorn too, which has no header timeout: headers
    sent a byte at a time held a connection for ever (the gateway's hole, found by review on
    2026-11-29). `--header-timeout` closes it (checked: with the SDK's own server the
    connection is still open after 4 s)."""
    from tests.integration.mcp.conftest import mcp_over_http

    with mcp_over_http(stack, "--header-timeout", "0.8") as server:
        assert _closed_while_trickling(server.url, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                       b"X", 4.0) is not None, "still open 4 s later"


def test_a_trickled_body_is_dropped_and_sigterm_still_stops_the_server(stack: Stack) -> None:
    """Found by review (2026-11-29): past its headers, a body sent a byte every half second
    held the connection for as long as the client liked (the SDK reads a body with no limit of
    time), and SIGTERM waited on it for ever. Now the body has --body-timeout seconds and the
    shutdown 10 s."""
    import signal

    from tests.integration.mcp.conftest import mcp_over_http

    with mcp_over_http(stack, "--header-timeout", "0.8", "--body-timeout", "1") as server:
        # the Host the SDK's DNS-rebinding check takes (without the port it answers 421)
        start = (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Accept: application/json, text/event-stream\r\nAuthorization: Bearer x\r\n"
                 b"Content-Length: 100000\r\n\r\n{")
        answer = _closed_while_trickling(server.url, start, b" ", 6.0)
        assert answer is not None, "the trickled request still holds its connection 6 s later"
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]  # not the SDK's 500
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=15) is not None
