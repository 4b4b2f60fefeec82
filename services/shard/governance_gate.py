"""The shard's side of the trust boundary: WriteGate and TrustSource over governance's gRPC API.

The shard holds only governance's address and a service token, never its
store. Concurrent writes' gate calls are coalesced: while one call is in
flight, the calls that arrive wait and go together in the next
``DecideWriteBatches`` (each still its own request, decided and recorded as if
sent alone, in one governance commit when they fit); a call that finds none in
flight goes at once as a plain ``DecideWrites``. A batch refused as a whole, a
request too large to share a call, or a governance without batches: each write
asks alone, from its own thread. The gate first asks without neighbours
(``neighbours_omitted``) and searches for them only when governance answers
``NEEDS_NEIGHBOURS`` (a contradiction rule applies to the writer); it then remembers that writer for
a few seconds and sends neighbours straight away. A write governance did
not decide is never stored: a refusal (INVALID_ARGUMENT, PERMISSION_DENIED…)
keeps its code, and no answer is ``Unavailable`` (GOVERNANCE_UNAVAILABLE).
Trust multipliers are cached for ``ttl_seconds`` so ranking costs a dict
lookup. When a lookup fails, every agent seen before keeps its last known
multiplier however old (a suspension stays in force while governance is
down); only agents never seen are left out, which ranks them at 1.0, and a
warning is logged (fail-open for them alone). A lookup governance answers with a refusal
(INVALID_ARGUMENT, PERMISSION_DENIED…) is not an outage: agents never seen rank at 0 then
(fail closed), and an error is logged. Lookups go in parts of at most ``TRUST_BATCH`` agents.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from engram.client._channel import open_channel
from engram.client._errors import EngramRpcError
from engram.client._settings import TlsFiles
from engram.client._tracing import tracing_active
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from services.common.erasure_source import ErasureOrder, order_from_proto
from services.common.errors import EngramError, InvalidArgument, Unavailable
from services.common.group_commit import GroupCommit
from services.common.metrics import Tally
from services.common.outbound import dependency_error
from services.shard.ports import GateCandidate, GateDecision, NeighbourSearch

log = logging.getLogger("engram.shard.trust")

DEFAULT_TTL_SECONDS = 1.5
TRUST_BATCH = 500
"""Agents a trust lookup names at most (governance takes ``ENGRAM_LIMITS_BATCH_ITEMS``, 1,000 by
default): a search whose candidates name more asks in parts."""
NEIGHBOURS_HINT_SECONDS = 5.0
_MAX_HINTS = 100_000
_MAX_COALESCERS = 10_000
"""Fleets with a gate coalescer kept; past it they are dropped and made again as needed."""
GATE_SEND_BYTES = 64 * 1024 * 1024
GATE_NEIGHBOUR_BYTES = 32 * 1024 * 1024
"""The neighbours' content one gate call carries at most, all candidates together: a batch of
1,000 records, each with 5 neighbours of 32 KiB, built a 155 MiB call (640 MB of the shard's
memory, then refused by gRPC as too large to send; found in review, 2026-11-30). Past it the
write is refused INVALID_ARGUMENT GATE_TOO_LARGE: fewer records per call fit. Half of
GATE_SEND_BYTES, leaving room for the candidates themselves (a request of at most
ENGRAM_LIMITS_GRPC_RECEIVE_BYTES): 1,000 records fit with neighbours of 6.7 KB on average."""
GATE_RECONNECT_MS = 150
"""How often the gate channel tries a lost governance again: writes resume within a few
hundred ms of governance's restart, not after gRPC's default backoff (1 s growing to 120 s)."""
MAX_COALESCED = 128
"""Gate requests in one DecideWriteBatches call (governance's limit)."""
MAX_COALESCED_CANDIDATES = 1000
"""Candidates in one call, all requests together (governance's ENGRAM_LIMITS_BATCH_ITEMS)."""
BATCHES_RETRY_SECONDS = 60.0
"""After governance answered UNIMPLEMENTED (older than the shard), how long single calls are
made before a batch is tried again (governance may have been upgraded meanwhile)."""
_UNNAMED = "(address not given)"
_TOKEN_SETTING = "ENGRAM_SHARD_SERVICE_TOKEN_FILE"


def _candidate(candidate: GateCandidate) -> gpb.WriteCandidate:
    return gpb.WriteCandidate(
        record_id=candidate.record_id, content_hash=candidate.content_hash,
        content=candidate.content, run_id=candidate.run_id, domain=candidate.domain,
        source=candidate.source, importance=candidate.importance, tags=list(candidate.tags),
        neighbours=[gpb.Neighbour(record_id=n.record_id, content=n.content,
                                  agent_id=n.agent_id, score=n.score)
                    for n in candidate.neighbours],
        metadata=dict(candidate.metadata),
    )


def _with_neighbours(candidates: Sequence[GateCandidate],
                     find_neighbours: NeighbourSearch) -> list[GateCandidate]:
    """Each candidate with its neighbours, within GATE_NEIGHBOUR_BYTES of their content (the
    search stops at the candidate that passes it)."""
    full, spent = [], 0
    for position, candidate in enumerate(candidates):
        neighbours = tuple(find_neighbours(candidate))
        spent += sum(len(n.content.encode()) for n in neighbours)
        if spent > GATE_NEIGHBOUR_BYTES:
            raise InvalidArgument(
                f"this batch of {len(candidates)} records and the stored records governance "
                f"compares them with (contradiction rules apply to the writer) come to more "
                f"than {GATE_NEIGHBOUR_BYTES // (1024 * 1024)} MiB by record {position}; send "
                "fewer records per call; nothing was stored", reason="GATE_TOO_LARGE",
                metadata={"limit_bytes": str(GATE_NEIGHBOUR_BYTES), "position": str(position)})
        full.append(replace(candidate, neighbours=neighbours))
    return full


def _unavailable(message: str) -> Unavailable:
    return Unavailable(f"{message}; nothing was stored", reason="GOVERNANCE_UNAVAILABLE")


def _failed(address: str, error: EngramRpcError) -> EngramError:
    """The error of a failed governance call: a refusal as governance gave it, else no answer."""
    return dependency_error("governance", address, error, credential_hint=_TOKEN_SETTING)


GateAnswer = gpb.DecideWritesResponse | EngramRpcError
SEND_ALONE = None
"""A coalesced call's answer telling the waiting write to send its own DecideWrites: its
group was refused as a whole (one request may be bad), or its request was too large to share
a call. Those calls go in parallel from each write's thread, never one after another."""


@dataclass(frozen=True)
class _GateJob:
    request: gpb.DecideWritesRequest
    span: Any = None
    """The write's gate span context (tracing on), linked from a call that carries others."""


def _is_current(span_context: Any) -> bool:
    from opentelemetry import trace

    return bool(span_context == trace.get_current_span().get_span_context())


class GovernanceGate:
    """WriteGate: ask without neighbours, again with them if governance needs them."""

    def __init__(self, client: GovernanceClient, *, address: str = _UNNAMED,
                 hint_seconds: float = NEIGHBOURS_HINT_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 max_candidates: int = MAX_COALESCED_CANDIDATES) -> None:
        self._client = client
        self._address = address
        self._hint_seconds = hint_seconds
        self._clock = clock
        self._max_candidates = max_candidates
        self._batches_from = 0.0  # clock time from which batches are tried (UNIMPLEMENTED)
        # One coalescer a fleet: a fleet's call in flight (its deny patterns searched over
        # large writes can take seconds) holds back only that fleet's next writes, never
        # another fleet's (found by review on 2026-11-30: one coalescer for all fleets queued
        # every fleet's writes behind one fleet's slow call, up to the gate's timeout).
        self._calls: dict[str, GroupCommit[_GateJob, GateAnswer | None]] = {}
        self._calls_lock = threading.Lock()
        self.calls = Tally()
        """Gate calls sent, by kind: "single" (DecideWrites) or "batch" (DecideWriteBatches)."""
        self.requests = Tally()
        """Gate requests those calls carried: with ``calls``, what the coalescing saves."""
        # (fleet, agent) -> until when to send neighbours without asking first (a hint only).
        self._needs_neighbours: dict[tuple[str, str], float] = {}

    def decide(self, fleet_id: str, agent_id: str, candidates: Sequence[GateCandidate],
               request_id: str, find_neighbours: NeighbourSearch) -> list[GateDecision]:
        request_id = request_id or uuid.uuid4().hex
        key = (fleet_id, agent_id)
        if self._needs_neighbours.get(key, 0.0) <= self._clock():
            reply = self._call(fleet_id, agent_id, request_id, candidates, omitted=True)
            if reply.status == gpb.GATE_STATUS_DECIDED:
                return self._decisions(reply, candidates)
            if reply.status != gpb.GATE_STATUS_NEEDS_NEIGHBOURS:
                # An older governance judged without neighbours: its answer cannot be trusted.
                raise _unavailable("governance does not support neighbours_omitted "
                                   "(upgrade governance before the shard)")
            if len(self._needs_neighbours) > _MAX_HINTS:
                self._needs_neighbours.clear()
            self._needs_neighbours[key] = self._clock() + self._hint_seconds
        full = _with_neighbours(candidates, find_neighbours)
        reply = self._call(fleet_id, agent_id, request_id, full, omitted=False)
        if reply.status == gpb.GATE_STATUS_NEEDS_NEIGHBOURS:
            raise _unavailable("governance asked for neighbours it was sent")
        return self._decisions(reply, candidates)

    def wait_connected(self, stopping: threading.Event, log_after_s: float = 5.0) -> None:
        """Return once the channel to governance is connected (a write can be decided), or
        once ``stopping`` is set; says in the log when governance does not answer."""
        ready = grpc.channel_ready_future(self._client.channel)
        waited = 0.0
        try:
            while not stopping.is_set():
                try:
                    ready.result(timeout=0.5)
                    return
                except grpc.FutureTimeoutError:
                    waited += 0.5
                if waited == log_after_s:
                    log.warning("governance at %s does not answer: NOT_SERVING until it does",
                                self._address)
        finally:
            ready.cancel()

    def _call(self, fleet_id: str, agent_id: str, request_id: str,
              candidates: Sequence[GateCandidate], *, omitted: bool) -> gpb.DecideWritesResponse:
        request = gpb.DecideWritesRequest(
            fleet_id=fleet_id, agent_id=agent_id, request_id=request_id,
            candidates=[_candidate(c) for c in candidates], neighbours_omitted=omitted)
        if tracing_active():  # the write's trace shows its gate time, however it was sent
            from opentelemetry import trace

            with trace.get_tracer(__name__).start_as_current_span("governance gate") as span:
                answer = self._decide_one(request, span.get_span_context())
        else:
            answer = self._decide_one(request, None)
        if isinstance(answer, EngramRpcError):
            failure = _failed(self._address, answer)
            if isinstance(failure, Unavailable):  # no decision: the write fails closed
                raise _unavailable(f"{failure.message}; retry later") from None
            raise failure from None
        return answer

    def _decide_one(self, request: gpb.DecideWritesRequest, span: Any) -> GateAnswer:
        """Through the coalescer while governance takes batches; alone (in parallel with
        other writes) otherwise, or when the coalescer says so."""
        answer: GateAnswer | None = SEND_ALONE
        if self._clock() >= self._batches_from:
            answer = self._coalescer(request.fleet_id).submit(_GateJob(request, span))
        return self._send_one(request) if answer is SEND_ALONE else answer

    def _coalescer(self, fleet_id: str) -> GroupCommit[_GateJob, GateAnswer | None]:
        with self._calls_lock:
            calls = self._calls.get(fleet_id)
            if calls is None:
                if len(self._calls) >= _MAX_COALESCERS:
                    self._calls.clear()  # a group in flight keeps its own reference
                calls = self._calls[fleet_id] = GroupCommit(self._send, max_group=MAX_COALESCED)
            return calls

    def _send(self, jobs: Sequence[_GateJob]) -> list[GateAnswer | None]:
        """The coalesced calls of one group, in chunks governance takes; never raises for
        an answer (each request gets its reply, its error, or SEND_ALONE). A lone write's
        call is made here: while it is in flight the next writes gather behind it."""
        if len(jobs) == 1:
            return self._send_traced(list(jobs))
        answers: list[GateAnswer | None] = []
        chunk: list[_GateJob] = []
        held = 0
        for job in jobs:
            size = len(job.request.candidates)
            if chunk and held + size > self._max_candidates:
                answers += self._send_shared(chunk)
                chunk, held = [], 0
            chunk.append(job)
            held += size
        answers += self._send_shared(chunk)
        return answers

    def _send_shared(self, chunk: list[_GateJob]) -> list[GateAnswer | None]:
        """A chunk of several requests as one call; a request alone in its chunk (too many
        candidates to share one) is sent by its own write, in parallel with the others."""
        return [SEND_ALONE] if len(chunk) == 1 else self._send_traced(chunk)

    def _send_traced(self, jobs: list[_GateJob]) -> list[GateAnswer | None]:
        """A chunk sent on behalf of other writes is a span linked to each write's gate span
        (OpenTelemetry's way for batches): each write's trace leads to the call that carried
        it. A write's own lone call is simply a child of its gate span."""
        requests = [job.request for job in jobs]
        if not tracing_active() or (len(jobs) == 1 and _is_current(jobs[0].span)):
            return self._send_chunk(requests)
        from opentelemetry import trace

        links = [trace.Link(job.span) for job in jobs if job.span is not None]
        with trace.get_tracer(__name__).start_as_current_span(
                "governance gate: coalesced call", links=links,
                attributes={"engram.gate.requests": len(jobs)}):
            return self._send_chunk(requests)

    def _send_chunk(self, requests: list[gpb.DecideWritesRequest]) -> list[GateAnswer | None]:
        if len(requests) == 1:
            return [self._send_one(requests[0])]
        self.calls.add("batch")
        self.requests.add(amount=len(requests))
        try:
            reply = self._client.decide_batches(requests)
        except EngramRpcError as error:
            if error.code == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("governance at %s does not take DecideWriteBatches (older than "
                            "the shard): gate calls are not coalesced for %.0f s",
                            self._address, BATCHES_RETRY_SECONDS)
                self._batches_from = self._clock() + BATCHES_RETRY_SECONDS
                return [SEND_ALONE] * len(requests)
            if _refused_as_a_whole(error):
                return [SEND_ALONE] * len(requests)  # each write asks alone, in parallel
            return [error] * len(requests)  # no answer (or overload) for any of them
        if len(reply.results) != len(requests):
            wrong = EngramRpcError(grpc.StatusCode.UNAVAILABLE,
                                   "governance answered with the wrong number of results")
            return [wrong] * len(requests)
        return [_answer(result) for result in reply.results]

    def _send_one(self, request: gpb.DecideWritesRequest) -> GateAnswer:
        self.calls.add("single")
        self.requests.add()
        try:
            return self._client.decide(request.fleet_id, request.agent_id, request.request_id,
                                       request.candidates,
                                       neighbours_omitted=request.neighbours_omitted)
        except EngramRpcError as error:
            return error

    def erasure(self, erasure_id: str) -> ErasureOrder:
        """ErasureSource: the erasure as governance recorded it."""
        try:
            return order_from_proto(self._client.erasure(erasure_id))
        except EngramRpcError as error:
            raise _failed(self._address, error) from None

    @staticmethod
    def _decisions(reply: gpb.DecideWritesResponse,
                   candidates: Sequence[GateCandidate]) -> list[GateDecision]:
        if len(reply.decisions) != len(candidates):
            raise _unavailable("governance answered with the wrong number of decisions")
        return [GateDecision(allowed=d.allowed, decision_id=d.decision_id,
                             rule_ids=tuple(d.rule_ids), reason=d.reason)
                for d in reply.decisions]


def _refused_as_a_whole(error: EngramRpcError) -> bool:
    """A batch refused for what one of its requests holds (an invalid request, a limit, a
    message too large for the transport), not for governance's state (overload, storage)."""
    if error.code == grpc.StatusCode.INVALID_ARGUMENT:
        return True
    return error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not error.reason


def _answer(result: gpb.DecideWriteBatchResult) -> GateAnswer:
    if result.WhichOneof("result") == "reply":
        return result.reply
    error = result.error
    code = getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    return EngramRpcError(code, error.message or "governance gave no reason", error.reason,
                          dict(error.metadata),
                          error.retry_delay.ToNanoseconds() / 1e9
                          if error.HasField("retry_delay") else None)


class GovernanceTrust:
    """TrustSource: batch lookups with a short per-agent cache."""

    CACHE_AGENTS = 100_000
    """Past this many cached agents (every fleet's), those at full trust or above are let go:
    during an outage an agent not cached ranks at 1.0 anyway. Suspended and demoted agents
    (below 1.0) stay, or one fleet's many agents could flush another fleet's demotions and an
    outage would then rank those agents at 1.0 (found by review)."""

    def __init__(self, client: GovernanceClient, *, address: str = _UNNAMED,
                 ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._address = address
        self._ttl = ttl_seconds
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, float]] = {}
        self._lock = threading.Lock()

    def multipliers(self, fleet_id: str, agent_ids: Collection[str]) -> dict[str, float]:
        """Each agent's multiplier; with governance unreachable, the last known one (however
        old), and agents never seen are left out (the caller ranks them 1.0)."""
        now = self._clock()
        found: dict[str, float] = {}
        missing: list[str] = []
        cache = self._cache
        for agent_id in agent_ids:
            hit = cache.get((fleet_id, agent_id))
            if hit is not None and hit[0] > now:
                found[agent_id] = hit[1]
            else:
                missing.append(agent_id)
        for start in range(0, len(missing), TRUST_BATCH):
            part = missing[start:start + TRUST_BATCH]
            try:
                found.update(self._fetch(fleet_id, part, now))
                continue
            except EngramError as error:
                failure = error
            # Every agent seen before keeps its last known multiplier, however old.
            stale = {a: hit[1] for a in part if (hit := cache.get((fleet_id, a))) is not None}
            found.update(stale)
            unseen = len(part) - len(stale)
            if isinstance(failure, Unavailable):  # no answer: the caller ranks them 1.0
                log.warning("trust lookup failed; %d agent(s) keep their last known "
                            "multiplier, %d never seen rank at 1.0", len(stale), unseen,
                            extra={"error": failure.message, "fleet_id": fleet_id})
            else:  # governance answered and refused the lookup: not an outage
                found.update({a: 0.0 for a in part if a not in stale})
                log.error("trust lookup refused by governance; %d agent(s) never seen rank "
                          "at 0 until it answers", unseen,
                          extra={"error": failure.message, "reason": failure.reason,
                                 "fleet_id": fleet_id})
        return found

    def _fetch(self, fleet_id: str, agent_ids: list[str], now: float) -> dict[str, float]:
        try:
            trusts = self._client.trusts(fleet_id, agent_ids)
        except EngramRpcError as error:
            failure = _failed(self._address, error)
            if not isinstance(failure, Unavailable):
                raise failure from None
            raise Unavailable(f"trust lookup failed: {failure.message}",
                              reason="GOVERNANCE_UNAVAILABLE") from None
        fetched = {t.agent_id: t.multiplier for t in trusts}
        expires = now + self._ttl
        with self._lock:
            if len(self._cache) > self.CACHE_AGENTS:  # demotions must outlive an outage
                self._cache = {k: v for k, v in self._cache.items() if v[1] < 1.0}
            for agent_id, multiplier in fetched.items():
                self._cache[(fleet_id, agent_id)] = (expires, multiplier)
        return fetched


def connect_governance(address: str, token_file: Path, *, gate_timeout: float = 5.0,
                       trust_timeout: float = 0.5, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                       tls: TlsFiles | None = None,
                       max_candidates: int = MAX_COALESCED_CANDIDATES,
                       ) -> tuple[GovernanceGate, GovernanceTrust]:
    """Both adapters over one channel; the token file holds a "service" principal's token.
    ``tls``: plaintext when absent or without a CA; TLS, or mutual TLS with a cert and key."""
    token = token_file.read_text().strip()
    files = tls or TlsFiles()
    # A batch with its neighbours can outgrow a client request (governance takes 64 MiB).
    channel = open_channel(address, **files, max_send_bytes=GATE_SEND_BYTES,
                           reconnect_backoff_ms=GATE_RECONNECT_MS, retries=False)
    gate_client = GovernanceClient(address, token, timeout=gate_timeout, channel=channel)
    trust_client = GovernanceClient(address, token, timeout=trust_timeout,
                                    channel=gate_client.channel)
    return (GovernanceGate(gate_client, address=address, max_candidates=max_candidates),
            GovernanceTrust(trust_client, address=address, ttl_seconds=ttl_seconds))
