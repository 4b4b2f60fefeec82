"""Readiness means ready: a gated shard says SERVING only once a write can succeed.

The shard is started while governance is down: its health must answer NOT_SERVING (a load
balancer must not send it writes it can only refuse) for as long as governance is down, then
SERVING once governance is started, and a write must succeed within 1 s of that SERVING.

Criterion: NOT_SERVING (not SERVING, not silence) on every probe while governance is down
(2 s after the shard answers its first probe; soak: 10 s); SERVING within 5 s of governance's
SERVING; a write succeeding within 1 s of the shard's SERVING.
"""

from __future__ import annotations

import time

import pytest

from engram.bench._harness import free_port
from tests.faults.conftest import Stack, first_write_after_serving, health, scale

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SERVING, NOT_SERVING = 1, 2


def _wait_for(address: str, wanted: set[int | None], limit_s: float) -> int | None:
    """Poll health (a fresh channel each time: no reconnect backoff) until a status in
    ``wanted`` or ``limit_s``; the last status seen."""
    deadline = time.monotonic() + limit_s
    status = health(address)
    while status not in wanted and time.monotonic() < deadline:
        time.sleep(0.02)
        status = health(address)
    return status


def test_gated_shard_is_not_serving_until_governance_answers(stack: Stack) -> None:
    stack.ports["governance"] = free_port()  # the shard points at it; nothing listens yet
    shard = stack.spawn("shard")
    address = stack.address("shard")
    first = _wait_for(address, {SERVING, NOT_SERVING}, 120)
    assert shard.poll() is None, stack.log("shard")
    seen = {first}
    until = time.monotonic() + scale(2, 10)
    while time.monotonic() < until:
        seen.add(health(address))
        time.sleep(0.05)
    assert seen == {NOT_SERVING}, f"health while governance is down: {seen}"

    stack.start("governance")
    began = time.monotonic()
    assert _wait_for(address, {SERVING}, 30) == SERVING
    serving_after_s = time.monotonic() - began
    write_after_s = first_write_after_serving(stack, 0)
    print(f"shard SERVING {serving_after_s:.2f} s after governance's SERVING; first write "
          f"{write_after_s:.2f} s after the shard's SERVING")
    assert serving_after_s <= 5.0
    assert write_after_s <= 1.0
