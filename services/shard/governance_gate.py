"""The shard's side of the trust boundary: WriteGate and TrustSource over governance's gRPC API.

The shard holds only governance's address and a service token, never its
store. Any failure to get a decision fails the write closed (``Unavailable``);
trust multipliers are cached for ``ttl_seconds`` so ranking costs a dict
lookup, and a failed lookup raises ``Unavailable`` so the shard can fall back
to 1.0 with a warning.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import grpc

from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from services.common.errors import InvalidArgument, Unavailable
from services.shard.ports import GateCandidate, GateDecision

DEFAULT_TTL_SECONDS = 1.5


def _candidate(candidate: GateCandidate) -> gpb.WriteCandidate:
    return gpb.WriteCandidate(
        record_id=candidate.record_id, content_hash=candidate.content_hash,
        content=candidate.content, run_id=candidate.run_id, domain=candidate.domain,
        source=candidate.source, importance=candidate.importance, tags=list(candidate.tags),
        neighbours=[gpb.Neighbour(record_id=n.record_id, content=n.content,
                                  agent_id=n.agent_id, score=n.score)
                    for n in candidate.neighbours],
    )


class GovernanceGate:
    """WriteGate: one DecideWrites call per write; no decision means no write."""

    def __init__(self, client: GovernanceClient) -> None:
        self._client = client

    def decide(self, fleet_id: str, agent_id: str, candidates: Sequence[GateCandidate],
               request_id: str) -> list[GateDecision]:
        try:
            reply = self._client.decide(fleet_id, agent_id, request_id or uuid.uuid4().hex,
                                        [_candidate(c) for c in candidates])
        except EngramRpcError as error:
            if error.code == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidArgument(f"governance refused the request: {error.message}",
                                      reason=error.reason or "INVALID_ARGUMENT") from None
            raise Unavailable(
                f"governance could not decide this write ({error.code.name}: {error.message}); "
                "nothing was stored, retry later", reason="GOVERNANCE_UNAVAILABLE") from None
        if len(reply.decisions) != len(candidates):
            raise Unavailable("governance answered with the wrong number of decisions; "
                              "nothing was stored", reason="GOVERNANCE_UNAVAILABLE")
        return [GateDecision(allowed=d.allowed, decision_id=d.decision_id,
                             rule_ids=tuple(d.rule_ids), reason=d.reason)
                for d in reply.decisions]


class GovernanceTrust:
    """TrustSource: batch lookups with a short per-agent cache."""

    def __init__(self, client: GovernanceClient, *, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, float]] = {}
        self._lock = threading.Lock()

    def multipliers(self, fleet_id: str, agent_ids: Collection[str]) -> dict[str, float]:
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
        if missing:
            found.update(self._fetch(fleet_id, missing, now))
        return found

    def _fetch(self, fleet_id: str, agent_ids: list[str], now: float) -> dict[str, float]:
        try:
            trusts = self._client.trusts(fleet_id, agent_ids)
        except EngramRpcError as error:
            raise Unavailable(f"governance trust lookup failed ({error.code.name}: "
                              f"{error.message})", reason="GOVERNANCE_UNAVAILABLE") from None
        fetched = {t.agent_id: t.multiplier for t in trusts}
        expires = now + self._ttl
        with self._lock:
            if len(self._cache) > 100_000:
                self._cache.clear()
            for agent_id, multiplier in fetched.items():
                self._cache[(fleet_id, agent_id)] = (expires, multiplier)
        return fetched


def connect_governance(address: str, token_file: Path, *, gate_timeout: float = 5.0,
                       trust_timeout: float = 0.5,
                       ttl_seconds: float = DEFAULT_TTL_SECONDS) -> tuple[GovernanceGate,
                                                                         GovernanceTrust]:
    """Both adapters over one channel; the token file holds a "service" principal's token."""
    token = token_file.read_text().strip()
    gate_client = GovernanceClient(address, token, timeout=gate_timeout)
    trust_client = GovernanceClient(address, token, timeout=trust_timeout,
                                    channel=gate_client.channel)
    return GovernanceGate(gate_client), GovernanceTrust(trust_client, ttl_seconds=ttl_seconds)
