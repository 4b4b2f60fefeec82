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
from dataclasses import dataclass, field

import grpc
import pytest

from engram.client import EngramRpcError, ShardClient
from tests.faults.conftest import SOAK, Stack, scale

pytestmark = [pytest.mark.faults, pytest.mark.slow]

WRITERS = 4
# A client that saw the server die reconnects quickly (the default backoff grows to minutes).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 500)]


def shard_client(stack: Stack, agent: str, timeout: float = 5.0) -> ShardClient:
    channel = grpc.insecure_channel(stack.address("shard"), options=CHANNEL_OPTIONS)
    return ShardClient(stack.address("shard"), stack.token(agent), timeout=timeout,
                       channel=channel)


@dataclass
class Writer:
    index: int
    stack: Stack
    stop: threading.Event
    acked: list[tuple[str, str, str]] = field(default_factory=list)  # (id, request_id, content)
    failures: int = 0
    unexpected: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return f"kill-run-{self.index}"

    def loop(self) -> None:
        with shard_client(self.stack, f"writer-{self.index}") as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                request_id = f"w{self.index}-{n}"
                content = f"writer {self.index} fact {n}: the cache key is {random.random()}"
                while not self.stop.is_set():
                    try:
                        reply = client.add(content, run_id=self.run_id, request_id=request_id)
                    except EngramRpcError as error:
                        self.failures += 1
                        if error.code not in (grpc.StatusCode.UNAVAILABLE,
                                              grpc.StatusCode.DEADLINE_EXCEEDED,
                                              grpc.StatusCode.CANCELLED):
                            self.unexpected.append(f"{error.code.name}: {error}")
                        time.sleep(0.05)
                        continue
                    self.acked.append((reply.record.id, request_id, content))
                    break


def _first_write_after_serving(stack: Stack, cycle: int) -> float:
    """Seconds from SERVING to the first write that succeeds, on a fresh channel."""
    began = time.monotonic()
    with shard_client(stack, "prober", timeout=2.0) as client:
        attempt = 0
        while time.monotonic() - began < 30:
            attempt += 1
            try:
                client.add(f"probe {cycle}.{attempt}", run_id="probe",
                           request_id=f"probe-{cycle}-{attempt}")
                return time.monotonic() - began
            except EngramRpcError:
                time.sleep(0.02)
    return float("inf")


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
    writers = [Writer(i, stack, stop) for i in range(WRITERS)]
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
            write_after_s.append(_first_write_after_serving(stack, cycle))
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
