"""The MCP server's body deadline (engram/mcp_server/_serve.py, found by review on
2026-11-29): a body that arrived in time reaches the app however late the app asks for it; one
that did not is 408 with the app never called; one past MAX_BODY is 413."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from engram.gateway._budget import BodyBudget
from engram.gateway._holders import BodyHolders
from engram.mcp_server._serve import MAX_BODY, body_deadline
from services.common.tokens import TokenSigner, ensure_keypair, key_paths

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


def test_a_body_of_too_many_values_is_413_and_the_app_never_called() -> None:
    flood = b'{"jsonrpc":"2.0","params":{"arguments":{"tags":[' + b"{}," * 150_000 + b"{}]}}}"
    got, sent = _run([(0.0, {"type": "http.request", "body": flood, "more_body": False})],
                     app_delay=0, seconds=1)
    assert got == [] and sent[0]["status"] == 413
    assert b"JSON values" in sent[1]["body"]


def _concurrent(tokens: list[bytes], budget: BodyBudget,
                holders: BodyHolders | None = None) -> list[int]:
    """One request per token, each holding a 1,000-byte body while the app answers them all
    together: the status each got (200 when the app answered it)."""
    statuses: list[int] = []
    arrived = 0
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal arrived
        await receive()
        arrived += 1
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def one(token: bytes) -> None:
        scope = {**SCOPE, "headers": [(b"authorization", b"Bearer " + token)] if token else []}
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await queue.put({"type": "http.request", "body": b" " * 1000, "more_body": False})

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await guarded(scope, queue.get, send)

    guarded = body_deadline(app, 1, budget, holders)

    async def main() -> None:
        tasks = [asyncio.create_task(one(token)) for token in tokens]
        while arrived + len(statuses) < len(tokens):
            await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    return sorted(statuses)


def test_bodies_held_at_once_are_bounded_by_token_and_in_all() -> None:
    # two bodies a token, three in all: the third of one token is 429, the fourth body 503
    budget = BodyBudget(total=3000, per_token=2000)
    assert _concurrent([b"a", b"a", b"a"], budget) == [200, 200, 429]
    assert _concurrent([b"a", b"a", b"b", b"c"], budget) == [200, 200, 200, 503]
    assert _concurrent([b"", b"", b""], budget) == [200, 200, 429]  # no token: one holder
    assert budget.held == 0  # every lease given back once its request was answered


def test_with_the_services_keys_made_up_tokens_share_one_small_share(tmp_path: Path) -> None:
    """Verified tokens each have a share; every token that does not verify, and a request
    without one, share the unverified one (made-up tokens each had a share of their own)."""
    ensure_keypair(tmp_path)
    signer = TokenSigner.load(key_paths(tmp_path).private)
    holders = BodyHolders((key_paths(tmp_path).public,))
    real, other = (signer.issue("agent", "fleet", {"agent"}).encode() for _ in range(2))
    budget = BodyBudget(total=10_000, per_token=2000, unverified=1000)
    assert _concurrent([b"made-up-1", b"made-up-2", b""], budget, holders) == [200, 429, 429]
    assert _concurrent([real, real, other, b"forged"], budget, holders) == [200, 200, 200, 200]
