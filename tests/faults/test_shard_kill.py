"""SIGKILL the shard at random moments under concurrent writes (item 1 of issue 16).

Writers (SDK clients in threads, each write with its own request_id, a failed write retried
with the same request_id) run throughout; the shard, gated by a real governance process, is
SIGKILLed at a random moment of each cycle and started again on the same store and port.

Criterion: 0 acknowledged writes missing after the restarts (GetRecord each, same content),
0 records failing re-hash (VerifyRecords over the fleet, SnapshotForRun with verify of each
writer's run), SERVING again within 5 s of the restart and a write succeeding within 1 s of
SERVING, in every cycle. 10 cycles in `make test`, 300 in `make soak`.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from engram.client import EngramRpcError
from tests.faults.conftest import (
    SOAK,
    Stack,
    Writer,
    first_write_after_serving,
    scale,
    shard_client,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

WRITERS = 4


@pytest.mark.xfail(SOAK, strict=True, reason=(
    "defects seen in the 300-cycle soak (2026-11-24): a retry of a request_id whose first "
    "attempt is still being committed fails INTERNAL (UNIQUE write_requests) instead of "
    "returning the stored result; the first write after SERVING took 2.05 s median, 12.2 s "
    "max once the store held ~50k records; SERVING took up to 5.8 s"))
def test_acknowledged_writes_survive_shard_sigkill(stack: Stack) -> None:
    cycles = scale(10, 300)
    rng = random.Random(1601)
    stack.start("governance")
    stack.start("shard")
    stop = threading.Event()
    writers = [Writer(i, stack, stop, "kill-run") for i in range(WRITERS)]
    threads = [threading.Thread(target=w.loop, daemon=True) for w in writers]
    for thread in threads:
        thread.start()
    serving_s: list[float] = []
    write_after_s: list[float] = []
    try:
        for cycle in range(cycles):
            time.sleep(rng.uniform(0.2, 1.5))
            stack.kill("shard")
            serving_s.append(stack.start("shard"))
            write_after_s.append(first_write_after_serving(stack, cycle))
        time.sleep(1.0)  # the writers' last retries land
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

    acked = [ack for w in writers for ack in w.acked]
    missing, changed = [], []
    with shard_client(stack, "auditor", timeout=600) as auditor:
        for record_id, request_id, content in acked:
            try:
                record = auditor.get(record_id)
            except EngramRpcError as error:
                missing.append(f"{request_id} ({record_id}): {error.code.name}")
                continue
            if record.content != content:
                changed.append(request_id)
        report = auditor.verify(all_records=True)
        snapshot_ids: set[str] = set()
        for writer in writers:
            snapshot_ids |= {r.id for r in auditor.snapshot(writer.run_id, verify=True)}
    not_in_snapshots = [a for a in acked if a[0] not in snapshot_ids]

    figures = (f"{cycles} cycles, {len(acked)} acknowledged writes, "
               f"{sum(w.failures for w in writers)} failed attempts (retried); SERVING after "
               f"restart max {max(serving_s):.2f} s (median {sorted(serving_s)[cycles // 2]:.2f}); "
               f"first write after SERVING max {max(write_after_s):.2f} s "
               f"(median {sorted(write_after_s)[cycles // 2]:.2f}); "
               f"{report.checked} records re-hashed")
    print(figures)
    assert len(acked) > cycles
    assert not missing, f"{len(missing)} acknowledged writes missing: {missing[:10]}"
    assert not changed, f"acknowledged writes with other content: {changed[:10]}"
    assert not report.failures, [f.detail for f in report.failures][:10]
    assert not not_in_snapshots, f"{len(not_in_snapshots)} acked writes not in their run"
    assert not [u for w in writers for u in w.unexpected], [w.unexpected for w in writers]
    assert max(serving_s) <= 5.0, figures
    assert max(write_after_s) <= 1.0, figures
