"""Retries through a flaky hop (item 7 of issue 16).

A proxy between the SDK and each service answers UNAVAILABLE to 30% of first attempts (half
before the call reaches the service, half after the service did the work and answered: the
reply is thrown away). Every kind of write goes through it with the SDK as a user calls it (no
request ids given, no retry loop of the test's own).

Criterion: every logical call succeeds, within its deadline; each takes effect exactly once:
the records stored and the gate decisions chained, the run's events (seq 1..N, chain
verifies), snapshots, artifacts and compactor iterations each equal the calls made, no more.
Fails without the SDK's retry policy (the injected UNAVAILABLE reaches the caller) and without
its idempotency keys (a write retried after the service did it lands twice).
"""

from __future__ import annotations

import json

import pytest

from engram.client import ArtifactsClient, CompactorClient, GovernanceClient, ShardClient
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.shard.v1 import shard_service_pb2 as spb
from tests.faults.conftest import Stack, scale
from tests.faults.flaky_proxy import FlakyProxy

pytestmark = [pytest.mark.faults]

RATE = 0.3


def test_every_write_takes_effect_exactly_once_through_a_flaky_hop(stack: Stack) -> None:
    for name in ("governance", "artifacts", "shard", "compactor"):
        stack.start(name)
    proxies = {name: FlakyProxy(stack.address(name), RATE, seed=i)
               for i, name in enumerate(("shard", "artifacts", "compactor"))}
    n = scale(40, 400)
    run = "flaky-run"
    token = stack.token("agent-r")
    try:
        with (ShardClient(proxies["shard"].address, token, timeout=20) as shard,
              ArtifactsClient(proxies["artifacts"].address, token, timeout=20) as art,
              CompactorClient(proxies["compactor"].address, token, timeout=20) as comp):
            art.start_run(run)
            # unnamed starts (each with its own metadata: the proxy fails only first attempts,
            # bytes it has not seen)
            unnamed = {art.start_run(metadata={"i": i}).run.run_id for i in range(scale(8, 40))}
            for i in range(n):
                shard.add(f"fact {i}: the flaky hop test", run_id=run)
                art.append_event(run, "tool.called", {"i": i})
                comp.record(run, cpb.IterationInput(iteration=0, plan_digest=f"p{i}",
                                                    status="ok", detail_json=json.dumps({"i": i})))
            for i in range(n // 4):
                # the fourth input duplicates the first (case and spacing): a replayed reply
                # still answers all four, the fourth with the first's record
                reply = shard.add_many([spb.RecordInput(content=text, run_id=run) for text in (
                    *(f"batch {i} item {j}" for j in range(3)), f"BATCH {i}  item 0")])
                assert len(reply.results) == 4, f"batch {i}: {len(reply.results)} results"
                assert reply.results[3].duplicate_of == reply.results[0].record.id
                art.create_snapshot(run, {"step": i})
                art.upload([f"artifact {i}".encode()], run_id=run, step_id=f"s{i}",
                           name=f"a{i}.txt")
        counts = {name: dict(proxy.counts) for name, proxy in proxies.items()}
        print(f"proxy outcomes: {counts}")
        for name, seen in counts.items():
            assert seen.get("before", 0) and seen.get("after", 0), f"{name}: nothing injected"

        records = n + 3 * (n // 4)
        admin = stack.token("admin", roles=("admin", "governor"))
        with (ShardClient(stack.address("shard"), token) as shard,
              GovernanceClient(stack.address("governance"), admin) as gov,
              ArtifactsClient(stack.address("artifacts"), token) as art,
              CompactorClient(stack.address("compactor"), token) as comp):
            stored = list(shard.list(run_id=run))
            assert len(stored) == records, f"{len(stored)} records stored for {records} writes"
            decided = [d for d in gov.decisions(agent_id="agent-r", fleet_id="fleet-f")]
            assert len(decided) == records, f"{len(decided)} gate decisions for {records} writes"
            assert gov.verify_chain().ok
            # a start without a name, retried, finds the run its first attempt started
            assert {r.run_id for r in art.list_runs()} == unnamed | {run}
            events = list(art.list_events(run))
            assert [e.seq for e in events] == list(range(1, n + 1)), "events lost or doubled"
            assert len(list(art.list_snapshots(run))) == n // 4
            assert len(list(art.list_artifacts(run))) == n // 4
            checked = art.verify(run)
            assert checked.checked == n // 4 and checked.snapshots_checked == n // 4
            assert not checked.problems and not checked.snapshot_problems
            assert len(list(art.replay(run))) == n  # replay re-hashes the event chain
            verified = comp.verify(run)
            assert verified.ok and verified.last_iteration == n, (
                f"{verified.last_iteration} iterations for {n} writes")
    finally:
        for proxy in proxies.values():
            proxy.close()
