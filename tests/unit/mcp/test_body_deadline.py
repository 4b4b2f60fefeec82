"""The MCP server's body deadline (engram/mcp_server/_serve.py, found by review on
2026-11-29): a body that arrived in time reaches the app however late the app asks for it; one
that did not is 408 with the app never called; one past MAX_BODY is 413."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("mcp")

from engram.mcp_server._serve import MAX_BODY, body_deadline

SCOPE = {"type": "http", "client": ("127.0.0.1", 1)}


def _run(messages: list[tuple[float, dict[str, Any]]], app_delay: float,
         seconds: float) -> tuple[list[Any], list[Any]]:
    """Feed ``messages`` (each after its delay) to the guarded app: what the app received,
    and what was sent to the client."""
    got: list[Any] = []
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(app_delay)
        got.append(await receive())

    async def main() -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def feed() -> None:
            for delay, message in messages:
                await asyncio.sleep(delay)
                await queue.put(message)

        async def send(message: Any) -> None:
            sent.append(message)

        feeder = asyncio.create_task(feed())
        await body_deadline(app, seconds)(SCOPE, queue.get, send)
        feeder.cancel()

    asyncio.run(main())
    return got, sent


def test_a_body_in_time_reaches_an_app_that_asks_late() -> None:
    # The body at 0.01 s against a 2 s deadline (0.2 s left a stalled event loop room to fire
    # both timers in one turn), the app asking after the deadline.
    got, sent = _run([(0.01, {"type": "http.request", "body": b"{}", "more_body": False})],
                     app_delay=2.5, seconds=2)
    assert got == [{"type": "http.request", "body": b"{}", "more_body": False}] and not sent


def test_a_body_in_pieces_is_given_whole() -> None:
    got, _ = _run([(0.01, {"type": "http.request", "body": b"{", "more_body": True}),
                   (0.05, {"type": "http.request", "body": b"}", "more_body": False})],
                  app_delay=0, seconds=1)
    assert got == [{"type": "http.request", "body": b"{}", "more_body": False}]


def test_a_late_body_is_408_and_the_app_never_called() -> None:
    got, sent = _run([(0.01, {"type": "http.request", "body": b"{", "more_body": True}),
                      (0.5, {"type": "http.request", "body": b"}", "more_body": False})],
                     app_delay=0, seconds=0.2)
    assert got == [] and sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]


def test_a_body_past_the_limit_is_413() -> None:
    big = {"type": "http.request", "body": b"x" * (MAX_BODY + 1), "more_body": True}
    got, sent = _run([(0.0, big)], app_delay=0, seconds=1)
    assert got == [] and sent[0]["status"] == 413
