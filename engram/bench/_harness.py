"""Shared benchmark machinery: the raw gRPC echo baseline and latency/throughput loops.

Every benchmark starts :class:`EchoServer` in its own run and reports its
figures next to the echo's, so results on a shared, noisy machine compare like
with like. The echo has no interceptors, no auth and no storage: it is the
ceiling for any RPC on this machine.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc

_ECHO_METHOD = "/engram.bench.Echo/Echo"


class EchoServer:
    """A raw gRPC echo (bytes in, bytes out) on 127.0.0.1, same thread-pool shape as the services."""

    def __init__(self, max_workers: int = 32) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        handler = grpc.method_handlers_generic_handler(
            "engram.bench.Echo",
            {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request)},
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> EchoServer:
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.stop(0).wait()

    def client(self) -> tuple[grpc.Channel, Callable[[bytes], bytes]]:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        call = channel.unary_unary(_ECHO_METHOD)
        return channel, call


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p95_ms: float
    p99_ms: float
    count: int

    @classmethod
    def of(cls, samples_s: list[float]) -> Latency:
        ordered = sorted(samples_s)

        def pct(p: float) -> float:
            index = min(len(ordered) - 1, max(0, round(p * (len(ordered) - 1))))
            return round(ordered[index] * 1000, 4)

        return cls(pct(0.50), pct(0.95), pct(0.99), len(ordered))


def sequential(call: Callable[[int], object], count: int, warmup: int = 50) -> Latency:
    """Latency of ``count`` calls made one after another."""
    for i in range(warmup):
        call(-1 - i)
    samples = []
    for i in range(count):
        start = time.perf_counter()
        call(i)
        samples.append(time.perf_counter() - start)
    return Latency.of(samples)


def concurrent(call: Callable[[int], object], total: int, in_flight: int) -> float:
    """Calls per second with ``in_flight`` callers sharing ``total`` calls."""
    counter = iter(range(total))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            call(i)

    threads = [threading.Thread(target=worker) for _ in range(in_flight)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return total / (time.perf_counter() - start)


def echo_baseline(sequential_calls: int = 2000, concurrent_calls: int = 20000,
                  in_flight: int = 64, payload: bytes = b"x" * 256) -> dict[str, float]:
    with EchoServer() as echo:
        channel, call = echo.client()
        try:
            latency = sequential(lambda _i: call(payload), sequential_calls)
            rate = concurrent(lambda _i: call(payload), concurrent_calls, in_flight)
        finally:
            channel.close()
    return {"echo_p50_ms": latency.p50_ms, "echo_p95_ms": latency.p95_ms,
            "echo_calls_per_s": round(rate, 1)}


def rss_mb(pid: int | None = None) -> float:
    """Resident set size of a process (default: this one), from /proc."""
    with open(f"/proc/{pid or os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("VmRSS not found")


def peak_rss_mb(pid: int | None = None) -> float:
    with open(f"/proc/{pid or os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("VmHWM not found")


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4)
