"""AdaptiveLimit: how many calls a service runs at once, found from the latency it measures,
and shared fairly between the callers that want them.

A static limit (``ENGRAM_<SVC>_MAX_CONCURRENT_RPCS``, 128 by default) is far above what two
cores commit: past capacity the excess queues and every caller's latency grows. With
``ENGRAM_<SVC>_ADMISSION=adaptive`` the limit follows the service's own latency instead (in the
manner of TCP Vegas and Netflix's concurrency-limits):

- each method's *uncongested* latency is learned from the calls that began and ended with at
  most one other call in flight (an exponentially weighted mean);
- every admitted call that ends compares its latency with its method's uncongested latency;
  the smoothed ratio above ``tolerance`` shrinks the limit multiplicatively, below it (with
  the limit in use) grows it by about one per round trip; the limit stays between ``floor``
  and the static ceiling;
- a caller (the agent its token names, verified first: a forged or expired token is refused
  UNAUTHENTICATED before it takes a place, and every token of one agent is one caller) gets
  at most its share of the limit (``limit // callers in flight``, at least one), so an
  agent with sixteen calls in flight is refused before one with none; and once the limit is
  reached, a caller with none in flight that has been admitted no more than the average
  caller lately (calls decaying over about a second) may go a quarter past it: a flood
  cannot shut a quiet agent out.

A refused call is answered RESOURCE_EXHAUSTED (reason ``OVERLOADED``, with RetryInfo) before
its request is parsed or its method run: nothing was done, a retry is safe. (The token check is
the verifier's, cached per token; access rules and revocations are checked after admission.)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from services.common.auth import call_metadata
from services.common.errors import ResourceExhausted
from services.common.interceptors import Behavior, _BehaviorInterceptor

ADAPTIVE_ROOM = 1.25
"""A light caller with no call in flight is admitted up to this times the limit."""

QUIET_IN_FLIGHT = 1
"""A call that began and ended with at most this many others in flight teaches its method's
uncongested latency."""


@dataclass(frozen=True)
class Admission:
    """One admitted call: handed back to :meth:`AdaptiveLimit.leave` when it ends."""

    caller: str
    method: str
    others: int
    """Calls in flight when it was admitted."""


INITIAL = 16
"""The limit at start: a service first flooded has no latency to learn from yet, and 128 calls
at once would take seconds to drain before the limit came down."""

FORGOTTEN = 0.01
"""A decayed count below this is no count (30 calls, idle for about 8 time constants)."""


class RecentUse:
    """Calls admitted per caller lately: each counts 1, decaying with time constant ``tau``
    seconds; and their sum (which decays alike, so the mean is exact). A caller whose count has
    decayed to nothing is forgotten (every ``tau`` seconds), so the table stays as small as the
    set of recent callers."""

    def __init__(self, tau: float = 1.0) -> None:
        self._tau = tau
        self._by: dict[str, tuple[float, float]] = {}  # caller -> (count, at)
        self._total = (0.0, 0.0)
        self._pruned = 0.0

    def _now(self, value: tuple[float, float], now: float) -> float:
        count, at = value
        return count * math.exp((at - now) / self._tau)

    def of(self, caller: str, now: float) -> float:
        """The caller's count now; below ``FORGOTTEN`` it counts as none (a caller idle for a
        few seconds is light again, whatever it did before)."""
        value = self._by.get(caller)
        count = self._now(value, now) if value is not None else 0.0
        return count if count >= FORGOTTEN else 0.0

    def mean(self, now: float) -> float:
        return self._now(self._total, now) / max(1, len(self._by))

    def add(self, caller: str, now: float) -> None:
        self._by[caller] = (self.of(caller, now) + 1.0, now)
        self._total = (self._now(self._total, now) + 1.0, now)
        if now - self._pruned > self._tau:
            self._pruned = now
            for gone in [c for c, v in self._by.items() if self._now(v, now) < FORGOTTEN]:
                del self._by[gone]


class AdaptiveLimit:
    def __init__(self, ceiling: int, setting: str, *, floor: int = 4, tolerance: float = 2.0,
                 smoothing: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.tolerance = tolerance
        self._smoothing = smoothing
        self._setting = setting
        self._limit = float(min(ceiling, INITIAL))  # grows while used at normal latency
        self._in_flight = 0
        self._by_caller: dict[str, int] = {}
        self._uncongested: dict[str, float] = {}  # method -> seconds
        self._ratio = 1.0  # smoothed latency / uncongested latency
        self._recent = RecentUse()
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        return int(self._limit)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def enter(self, caller: str, method: str) -> Admission:
        """Admit the call or raise RESOURCE_EXHAUSTED ``OVERLOADED``."""
        with self._lock:
            now = self._clock()
            limit = int(self._limit)
            held = self._by_caller.get(caller, 0)
            callers = len(self._by_caller) + (0 if held else 1)
            share = max(1, limit // callers)
            if (self._in_flight < limit and held < share) or (
                    not held and self._in_flight < math.ceil(limit * ADAPTIVE_ROOM)
                    and self._recent.of(caller, now) <= self._recent.mean(now)):
                admitted = Admission(caller, method, self._in_flight)
                self._in_flight += 1
                self._by_caller[caller] = held + 1
                self._recent.add(caller, now)
                return admitted
            refusal = (held, share, limit)
        held, share, limit = refusal
        wait = self._uncongested.get(method, 0.05)
        raise ResourceExhausted(
            f"this service is past the load it serves at its normal latency: it runs {limit} "
            f"calls at once now (adaptive, at most {self.ceiling}: {self._setting}) and this "
            f"caller has {held} of its share of {share} in flight; retry after the delay in "
            "RetryInfo",
            reason="OVERLOADED",
            metadata={"limit": str(limit), "caller_in_flight": str(held),
                      "caller_share": str(share), "setting": self._setting},
            retry_delay=max(0.01, min(1.0, 2 * wait)))

    def leave(self, admission: Admission, seconds: float) -> None:
        """The call ended after ``seconds`` (an error too: it used the capacity all the same)."""
        with self._lock:
            quiet = admission.others <= QUIET_IN_FLIGHT and self._in_flight <= QUIET_IN_FLIGHT + 1
            self._in_flight -= 1
            left = self._by_caller[admission.caller] - 1
            if left:
                self._by_caller[admission.caller] = left
            else:
                del self._by_caller[admission.caller]
            alpha = self._smoothing
            uncongested = self._uncongested.get(admission.method)
            if quiet:  # ran with at most one other call, from start to end
                uncongested = seconds if uncongested is None else (
                    (1 - alpha) * uncongested + alpha * seconds)
                self._uncongested[admission.method] = uncongested
            if not uncongested:
                return  # no quiet call of this method seen yet: nothing to compare with
            self._ratio = (1 - alpha) * self._ratio + alpha * (seconds / uncongested)
            if self._ratio > self.tolerance:
                self._limit = max(float(self.floor), self._limit * 0.95)
            elif admission.others + 1 >= int(self._limit):  # in use: try one more per round
                self._limit = min(float(self.ceiling), self._limit + 1 / self._limit)


class AdaptiveAdmissionInterceptor(_BehaviorInterceptor):
    """Admits each unary call through an :class:`AdaptiveLimit`, keyed by the caller
    ``caller_of`` names from the call's metadata (raising for a token that does not verify),
    before its request is parsed (the handler it hands on takes the raw bytes; the method's
    own parser runs only once the call is admitted). Streams and public methods (health,
    reflection) pass: the static concurrency limit outside still bounds them."""

    def __init__(self, limit: AdaptiveLimit, is_public: Callable[[str], bool],
                 caller_of: Callable[[dict[str, str]], str]) -> None:
        super().__init__()
        self._limit = limit
        self._is_public = is_public
        self._caller_of = caller_of

    def wrap_handler(self, handler: grpc.RpcMethodHandler[Any, Any], method: str) -> Any:
        if handler.unary_unary is None or self._is_public(method):
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self._admitting(handler.unary_unary, handler.request_deserializer, method),
            request_deserializer=None,  # raw bytes: parsed only once admitted
            response_serializer=handler.response_serializer)

    def _admitting(self, behavior: Behavior, parse: Callable[[bytes], Any] | None,
                   method: str) -> Behavior:
        limit, caller_of = self._limit, self._caller_of

        def unary(raw: bytes, context: grpc.ServicerContext) -> Any:
            metadata = call_metadata(context.invocation_metadata())
            admission = limit.enter(caller_of(metadata), method)
            began = time.perf_counter()
            try:
                return behavior(parse(raw) if parse is not None else raw, context)
            finally:
                limit.leave(admission, time.perf_counter() - began)

        return unary
