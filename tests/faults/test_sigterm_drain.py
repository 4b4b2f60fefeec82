"""SIGTERM under load, for every service (item 8 of issue 16).

Eight client threads call the service back to back (a durable write where the service has
one) while a probe polls its health every 10 ms, as a load balancer would; a caller stops
sending new calls once the probe has seen NOT_SERVING. SIGTERM arrives in the middle.

Criterion: health answers NOT_SERVING before the port stops answering; 0 failures among the
calls started before the probe saw NOT_SERVING (the calls the service accepted, including the
ones in flight at SIGTERM, of which there must be some); exit code 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from engram.client import ArtifactsClient, CompactorClient, GovernanceClient, ShardClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from tests.faults.conftest import Stack, health, scale

pytestmark = [pytest.mark.faults, pytest.mark.slow]

CALLERS = 8
NEEDS = {"governance": (), "artifacts": (), "shard": ("governance",),
         "compactor": ("governance", "shard", "artifacts")}


def _operation(stack: Stack, name: str, caller: int) -> tuple[Callable[[int], object], object]:
    """A call for caller ``caller`` (its n-th call gets ``n``) and the client to close."""
    address = stack.address(name)
    if name == "governance":
        gov = GovernanceClient(address, stack.token("admin", roles=("admin", "governor")))
        tiers = ("trusted", "standard", "probation")
        return (lambda n: gov.set_tier(f"agent-{caller}", tiers[n % 3], reason=f"call {n}"),
                gov)
    if name == "shard":
        shard = ShardClient(address, stack.token(f"agent-{caller}"))
        return (lambda n: shard.add(f"caller {caller} fact {n}", run_id=f"drain-{caller}",
                                    request_id=f"c{caller}-{n}"), shard)
    if name == "artifacts":
        art = ArtifactsClient(address, stack.token(f"agent-{caller}"))
        art.start_run(f"drain-{caller}")
        return (lambda n: art.append_event(f"drain-{caller}", "tool.called", {"n": n},
                                           request_id=f"c{caller}-{n}"), art)
    comp = CompactorClient(address, stack.token(f"agent-{caller}"))
    return (lambda n: comp.record(f"drain-{caller}", cpb.IterationInput(
        iteration=n, plan_digest=f"p{n}", status="ok", detail_json='{"notes": "x"}'),
        request_id=f"c{caller}-{n}"), comp)


@dataclass
class Probe:
    address: str
    stop: threading.Event
    seen: list[tuple[float, int | None]] = field(default_factory=list)
    not_serving_at: float | None = None
    sigterm_sent: bool = False
    slow: int = 0
    """Probes unanswered in 2 s before SIGTERM (a starved service), counted, not a stop."""

    def loop(self) -> None:
        while not self.stop.is_set():
            status = health(self.address, timeout=2.0)
            now = time.monotonic()
            if status is None and not self.sigterm_sent:
                self.slow += 1
                continue
            if not self.seen or self.seen[-1][1] != status:
                self.seen.append((now, status))
            if status != 1 and self.not_serving_at is None:
                self.not_serving_at = now
            time.sleep(0.01)


@pytest.mark.parametrize("name", ["governance", "artifacts", "shard", "compactor"])
def test_sigterm_drains_without_failing_accepted_calls(stack: Stack, name: str) -> None:
    for dependency in NEEDS[name]:
        stack.start(dependency)
    stack.start(name)
    stop = threading.Event()
    probe = Probe(stack.address(name), stop)
    calls: list[tuple[float, float, str]] = []  # (started, ended, outcome)

    def caller(index: int) -> None:
        call, client = _operation(stack, name, index)
        n = 0
        try:
            while probe.not_serving_at is None and not stop.is_set():
                n += 1
                started = time.monotonic()
                try:
                    call(n)
                    outcome = "ok"
                except Exception as error:  # every failure counts, whatever its kind
                    outcome = f"{type(error).__name__}: {error}"
                calls.append((started, time.monotonic(), outcome))
        finally:
            client.close()  # type: ignore[attr-defined]

    threads = [threading.Thread(target=probe.loop, daemon=True)]
    threads += [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(CALLERS)]
    for thread in threads:
        thread.start()
    time.sleep(scale(1, 20))
    sigterm_at = time.monotonic()
    probe.sigterm_sent = True
    stack.popen(name).terminate()
    exit_code = stack.popen(name).wait(timeout=60)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)

    assert probe.not_serving_at is not None
    accepted = [c for c in calls if c[0] < probe.not_serving_at]
    failed = [c[2] for c in accepted if c[2] != "ok"]
    in_flight = [c for c in accepted if c[0] < sigterm_at < c[1]]
    statuses = [status for _, status in probe.seen]
    first_down = probe.not_serving_at - sigterm_at
    print(f"{name}: {len(accepted)} calls accepted, {len(in_flight)} in flight at SIGTERM, "
          f"{len(failed)} failed; health {statuses} (NOT_SERVING {first_down * 1000:.0f} ms "
          f"after SIGTERM); {probe.slow} health probes unanswered in 2 s under load; "
          f"exit code {exit_code}")
    assert statuses[:3] == [1, 2, None], f"health went {statuses}, not SERVING -> NOT_SERVING"
    assert in_flight, "no call was in flight at SIGTERM: the drain was not exercised"
    assert not failed, f"{len(failed)} accepted calls failed: {failed[:5]}"
    assert exit_code == 0
