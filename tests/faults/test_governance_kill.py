"""SIGKILL governance at random moments under concurrent gated writes (item 2 of issue 16).

Writers (as in test_shard_kill: SDK clients in threads, a request_id per write, a failed write
retried with the same request_id) write without pause into a shard gated by governance;
governance is SIGKILLed at a random moment of each cycle, left down a moment, and started
again on the same store and port. The shard is never restarted.

Criterion: no write acknowledged without a decision (every acknowledged record's
gate_decision_id is found in governance after the restarts, allowed, for that record);
governance's chain verifies after the restarts (VerifyChain ok); in every cycle a write through
the shard succeeds within 1 s of governance reporting SERVING (the shard's gate channel
reconnects without waiting out gRPC's default backoff); no error other than UNAVAILABLE /
DEADLINE_EXCEEDED / CANCELLED. 5 cycles in `make test`, 100 in `make soak`.
"""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest

from engram.client import EngramRpcError, GovernanceClient
from tests.faults.conftest import (
    Stack,
    Writer,
    first_write_after_serving,
    health,
    scale,
    shard_client,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

WRITERS = 4
BATCH = 100


def _serving_without_governance(stack: Stack) -> None:
    """What the README promises while governance is away: the shard stays SERVING, searches
    answer, writes fail UNAVAILABLE with GOVERNANCE_UNAVAILABLE."""
    assert health(stack.address("shard")) == 1
    with shard_client(stack, "reader", timeout=5.0) as client:
        client.search("fact")
        with pytest.raises(EngramRpcError) as refused:
            client.add("written while governance is away", run_id="away")
    assert (refused.value.code, refused.value.reason) == (
        grpc.StatusCode.UNAVAILABLE, "GOVERNANCE_UNAVAILABLE")


def test_no_write_acknowledged_without_governance_and_writes_resume(stack: Stack) -> None:
    cycles = scale(5, 100)
    rng = random.Random(1602)
    stack.start("governance")
    stack.start("shard")
    stop = threading.Event()
    writers = [Writer(i, stack, stop, "gov-kill-run") for i in range(WRITERS)]
    threads = [threading.Thread(target=w.loop, daemon=True) for w in writers]
    for thread in threads:
        thread.start()
    serving_s: list[float] = []
    write_after_s: list[float] = []
    try:
        for cycle in range(cycles):
            time.sleep(rng.uniform(0.2, 1.0))
            stack.kill("governance")
            time.sleep(rng.uniform(0.5, 2.0))  # the writers are refused meanwhile
            if cycle == 0:
                _serving_without_governance(stack)
            serving_s.append(stack.start("governance"))
            write_after_s.append(first_write_after_serving(stack, cycle))
        time.sleep(0.5)  # the writers' last retries land
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

    acked = [ack for w in writers for ack in w.acked]
    with shard_client(stack, "auditor", timeout=600) as auditor:
        decision_of = {record_id: auditor.get(record_id).gate_decision_id
                       for record_id, _, _ in acked}
    undecided = [r for r, d in decision_of.items() if not d]
    admin = stack.token("admin", roles=("admin", "governor"))
    with GovernanceClient(stack.address("governance"), admin, timeout=600) as gov:
        ids = sorted({d for d in decision_of.values() if d})
        found = {}
        for at in range(0, len(ids), BATCH):
            found.update({d.decision_id: d for d in gov.decisions_by_id(ids[at:at + BATCH])})
        chain = gov.verify_chain()
    unknown = [r for r, d in decision_of.items() if d and d not in found]
    refused = [d.decision_id for d in found.values() if not d.allowed]
    other_record = [r for r, d in decision_of.items() if d in found and found[d].record_id != r]

    median = sorted(write_after_s)[cycles // 2]
    figures = (f"{cycles} cycles, {len(acked)} acknowledged writes, "
               f"{sum(w.failures for w in writers)} failed attempts (retried), "
               f"{len(found)} decisions found; governance SERVING after restart max "
               f"{max(serving_s):.2f} s; first shard write after SERVING max "
               f"{max(write_after_s):.2f} s (median {median:.2f}); chain ok {chain.ok}")
    print(figures)
    assert len(acked) > cycles
    assert not undecided, f"{len(undecided)} acknowledged records without a decision id"
    assert not unknown, f"{len(unknown)} acknowledged records whose decision governance lacks"
    assert not refused, f"{len(refused)} acknowledged records governance refused"
    assert not other_record, f"decisions for another record: {other_record[:10]}"
    assert chain.ok, list(chain.problems)[:10]
    assert not [u for w in writers for u in w.unexpected], [w.unexpected for w in writers]
    assert max(write_after_s) <= 1.0, figures
