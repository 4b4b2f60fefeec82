"""Admission: how much work a service takes at once, and how fast one agent may call it.

These limits are all answered ``RESOURCE_EXHAUSTED`` with ``google.rpc.RetryInfo`` before
the method runs (nothing done, so a retry is always safe):

- :class:`ConcurrencyLimit`: calls in flight per service process
  (``ENGRAM_<SVC>_MAX_CONCURRENT_RPCS``); one more is refused at once with reason
  ``CONCURRENCY_LIMIT`` rather than queued behind the others.
- :class:`RateLimiter`: a token bucket per agent (fleet and agent id) and per kind of call,
  reads and writes apart (``ENGRAM_<SVC>_RATE_LIMIT_READS`` / ``_READ_BURST``,
  ``_RATE_LIMIT_WRITES`` / ``_WRITE_BURST``); an empty bucket is refused with reason
  ``RATE_LIMITED`` and the time until it holds a token again. Service principals are not
  rate limited per agent: their calls carry many agents' work (the shard's gate calls).
- :class:`StreamsPerAgent`: server streams open at once per agent
  (``ENGRAM_<SVC>_MAX_STREAMS_PER_AGENT``), per fleet, all its agents together
  (``ENGRAM_<SVC>_MAX_STREAMS_PER_FLEET``, default half of the concurrency limit), and in
  all (``ENGRAM_<SVC>_MAX_STREAMS``, default three quarters of it, the last quarter of those
  kept for fleets holding few); one more is refused with reason ``STREAM_LIMIT``.
- :class:`RecordRate`: records a second one agent may write, each record of a batch a token
  (the shard's ``ENGRAM_SHARD_RATE_LIMIT_RECORDS`` / ``_RECORD_BURST``); refused with reason
  ``RATE_LIMITED`` (metadata ``kind`` ``records``) before anything is stored. Service
  principals pass, as for the call rates.

Which methods are reads and which writes is declared by each service beside its access
table (:data:`MethodKinds`), never guessed from a name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from services.common.errors import ResourceExhausted


class CallKind(StrEnum):
    READ = "read"
    WRITE = "write"


READ = CallKind.READ
WRITE = CallKind.WRITE

MethodKinds = Mapping[str, CallKind]
"""Full method name -> whether it reads or writes, for every RPC of a service."""

CONCURRENCY_RETRY_SECONDS = 0.05
"""What a refused caller is told to wait: calls free their slot in milliseconds."""


class ConcurrencyLimit:
    """At most ``limit`` calls in flight; :meth:`enter` refuses the next one at once."""

    def __init__(self, limit: int, setting: str) -> None:
        self._limit = limit
        self._setting = setting
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def enter(self) -> None:
        with self._lock:
            if self._in_flight >= self._limit:
                raise ResourceExhausted(
                    f"this service is handling {self._limit} calls at once, its limit "
                    f"({self._setting}); retry after the delay in RetryInfo",
                    reason="CONCURRENCY_LIMIT",
                    metadata={"limit": str(self._limit), "setting": self._setting},
                    retry_delay=CONCURRENCY_RETRY_SECONDS)
            self._in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1


class StreamsPerAgent:
    """At most ``limit`` server streams open at once per agent (fleet and agent id), at most
    ``fleet_limit`` per fleet, all its agents together, and at most ``total_limit`` in all: a
    stream holds a slot of :class:`ConcurrencyLimit` until it ends, and a caller that opens
    streams and never reads them would otherwise hold every slot, for every fleet (one agent
    alone, an admin who mints tokens for many agent ids of its fleet, or two fleets at their
    fleet limits together). The last quarter of ``total_limit`` goes only to fleets holding
    fewer than a quarter of it, so two fleets at their limits leave other fleets streams as
    well as unary calls. The counts are taken together or not at all, and :meth:`leave` gives
    them back."""

    def __init__(self, limit: int, setting: str, fleet_limit: int | None = None,
                 fleet_setting: str = "", total_limit: int | None = None,
                 total_setting: str = "") -> None:
        self._limit = limit
        self._setting = setting
        self._fleet_limit = fleet_limit
        self._fleet_setting = fleet_setting
        self._total_limit = total_limit
        self._total_setting = total_setting
        self._reserve = total_limit // 4 if total_limit is not None else 0
        """The last stream slots, kept for fleets holding fewer than this many."""
        self._open: dict[tuple[str, str], int] = {}
        self._fleets: dict[str, int] = {}
        self._lock = threading.Lock()

    def open_in(self, fleet_id: str) -> int:
        """Streams the fleet's agents hold open now."""
        with self._lock:
            return self._fleets.get(fleet_id, 0)

    def enter(self, fleet_id: str, agent_id: str) -> None:
        key = (fleet_id, agent_id)
        with self._lock:
            if self._open.get(key, 0) >= self._limit:
                raise ResourceExhausted(
                    f"agent {agent_id} has {self._limit} streams open on this service, its "
                    f"limit ({self._setting}); read or close one first",
                    reason="STREAM_LIMIT",
                    metadata={"limit": str(self._limit), "setting": self._setting,
                              "scope": "agent"},
                    retry_delay=1.0)
            fleet_limit = self._fleet_limit
            if fleet_limit is not None and self._fleets.get(fleet_id, 0) >= fleet_limit:
                raise ResourceExhausted(
                    f"fleet {fleet_id} has {fleet_limit} streams open on this service, its "
                    f"limit ({self._fleet_setting}); read or close one first",
                    reason="STREAM_LIMIT",
                    metadata={"limit": str(fleet_limit), "setting": self._fleet_setting,
                              "scope": "fleet"},
                    retry_delay=1.0)
            self._check_total(fleet_id)
            self._open[key] = self._open.get(key, 0) + 1
            self._fleets[fleet_id] = self._fleets.get(fleet_id, 0) + 1

    def _check_total(self, fleet_id: str) -> None:
        total_limit = self._total_limit
        if total_limit is None:
            return
        held, total = self._fleets.get(fleet_id, 0), sum(self._fleets.values())
        full = total >= total_limit
        if full or (self._reserve and held >= self._reserve
                    and total >= total_limit - self._reserve):
            raise ResourceExhausted(
                f"this service has {total} streams open, "
                + (f"its limit ({self._total_setting})" if full else
                   f"and its last {self._reserve} of {total_limit} ({self._total_setting}) "
                   f"are kept for fleets holding fewer than {self._reserve} (fleet "
                   f"{fleet_id} holds {held})")
                + "; read or close one first, or retry later",
                reason="STREAM_LIMIT",
                metadata={"limit": str(total_limit), "setting": self._total_setting,
                          "scope": "service"},
                retry_delay=1.0)

    def leave(self, fleet_id: str, agent_id: str) -> None:
        key = (fleet_id, agent_id)
        with self._lock:
            left = self._open.get(key, 1) - 1
            if left > 0:
                self._open[key] = left
            else:
                self._open.pop(key, None)
            left = self._fleets.get(fleet_id, 1) - 1
            if left > 0:
                self._fleets[fleet_id] = left
            else:
                self._fleets.pop(fleet_id, None)


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; starts full."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = now

    def take(self, now: float, cost: float = 1.0) -> float:
        """Take ``cost`` tokens: 0.0 when there were as many, else the seconds until there are
        (nothing taken then)."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens + 1e-9 >= cost:  # a caller that waited the delay given is let in
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.updated) * self.rate >= self.burst


class RateLimiter:
    """One :class:`TokenBucket` per (fleet, agent, kind); a rate of 0 turns a kind off."""

    MAX_BUCKETS = 100_000
    """Past this many agents, buckets that refilled are dropped (they start full anyway)."""

    def __init__(self, limits: Mapping[CallKind, tuple[float, int]],
                 settings: Mapping[CallKind, str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = {kind: limit for kind, limit in limits.items() if limit[0] > 0}
        self._settings = settings
        self._clock = clock
        self._buckets: dict[tuple[str, str, CallKind], TokenBucket] = {}
        self._lock = threading.Lock()

    def admit(self, fleet_id: str, agent_id: str, kind: CallKind) -> None:
        limit = self._limits.get(kind)
        if limit is None:
            return
        rate, burst = limit
        key = (fleet_id, agent_id, kind)
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.MAX_BUCKETS:
                    self._forget_full(now)
                bucket = self._buckets[key] = TokenBucket(rate, burst, now)
            wait = bucket.take(now)
        if wait > 0:
            raise ResourceExhausted(
                f"agent {agent_id} of fleet {fleet_id} is over its {kind.value} rate "
                f"({rate:g} calls a second, bursts of {burst}: {self._settings[kind]}); "
                f"retry in {wait:.3f} s",
                reason="RATE_LIMITED",
                metadata={"kind": kind.value, "rate_per_second": f"{rate:g}",
                          "burst": str(burst), "setting": self._settings[kind]},
                retry_delay=wait)

    def _forget_full(self, now: float) -> None:
        for key in [k for k, b in self._buckets.items() if b.full(now)]:
            del self._buckets[key]


RecordCounts = Mapping[str, Callable[[Any], int]]
"""Full method name -> how many records a request of it writes, for each RPC that writes
records (the shard's CreateRecord, BatchCreateRecords, ImportRecords)."""


class RecordRate:
    """Records a second one agent (fleet and agent id) may write: a token bucket where each
    record of a call is a token, taken all at once before the call runs or not at all.

    The call rate (:class:`RateLimiter`) counts a batch of 1,000 records as one write: 100
    calls a second of 1,000 records passed it. ``burst`` is at least the largest batch (the
    settings refuse less), so a full batch always fits in an idle bucket; a call carrying
    more (refused anyway, BATCH_TOO_LARGE) takes what the bucket holds at most."""

    MAX_BUCKETS = 100_000
    """Past this many agents, buckets that refilled are dropped (they start full anyway)."""

    def __init__(self, rate: float, burst: int, setting: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a record rate needs a rate above 0 and a burst of at least 1 "
                             f"({setting}: {rate}, {burst})")
        self._rate = rate
        self._burst = burst
        self._setting = setting
        self._clock = clock
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._lock = threading.Lock()

    def admit(self, fleet_id: str, agent_id: str, records: int) -> None:
        cost = min(max(records, 0), self._burst)
        if cost == 0:
            return
        key = (fleet_id, agent_id)
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.MAX_BUCKETS:
                    for full in [k for k, b in self._buckets.items() if b.full(now)]:
                        del self._buckets[full]
                bucket = self._buckets[key] = TokenBucket(self._rate, self._burst, now)
            wait = bucket.take(now, cost)
        if wait > 0:
            raise ResourceExhausted(
                f"agent {agent_id} of fleet {fleet_id} is over its record rate "
                f"({self._rate:g} records a second, bursts of {self._burst}: {self._setting}); "
                f"this call writes {records} records; retry in {wait:.3f} s",
                reason="RATE_LIMITED",
                metadata={"kind": "records", "rate_per_second": f"{self._rate:g}",
                          "burst": str(self._burst), "records": str(records),
                          "setting": self._setting},
                retry_delay=wait)
