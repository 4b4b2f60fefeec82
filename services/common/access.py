"""Access restrictions every service enforces on every call: revoked tokens, revoked agents,
suspended agents.

Governance holds them (``ListAccessRestrictions``); each service keeps the last set it
fetched in an :class:`AccessRestrictions` and a background thread polls for a newer version
every ``refresh_seconds`` (``ENGRAM_AUTH_RESTRICTIONS_REFRESH_SECONDS``, default 2 s), so a
revocation or a suspension takes effect everywhere within that interval plus one call.
While governance is unreachable the last set stays in force. Before the first set arrives
(a cold start with governance down) every authenticated call is refused with UNAVAILABLE
``ACCESS_RESTRICTIONS_UNKNOWN`` and retried by clients: a restart never reopens a revoked
token.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engram.client import EngramRpcError, TlsFiles
from engram.client._channel import open_channel
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from services.common.errors import PermissionDenied, Unauthenticated, Unavailable
from services.common.tokens import Principal

RECONNECT_MS = 150

log = logging.getLogger("engram.access")

AgentKey = tuple[str, str]
"""``(fleet_id, agent_id)``."""


@dataclass(frozen=True)
class Restrictions:
    """One version of the set governance holds."""

    version: int
    revoked_tokens: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(fleet_id, jti) -> the token's expiry (seconds since the epoch). A revocation is its
    fleet's: a token of another fleet with the same jti is not refused by it."""
    revoked_agents: Mapping[AgentKey, int] = field(default_factory=dict)
    """Tokens of the agent issued at or before this second are refused."""
    suspended: frozenset[AgentKey] = frozenset()


RestrictionSource = Callable[[int], Restrictions | None]
"""``source(since_version)``: the current set, or None when nothing changed since then."""


class AccessRestrictions:
    """The last known restrictions, refreshed in the background; checked on every call."""

    def __init__(self, source: RestrictionSource, *, refresh_seconds: float,
                 suspended_may_call: frozenset[str] = frozenset(), origin: str = "governance",
                 close: Callable[[], None] = lambda: None) -> None:
        self._source = source
        self._close = close
        self._refresh_seconds = refresh_seconds
        self._suspended_may_call = suspended_may_call
        self._origin = origin
        self._current: Restrictions | None = None
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def version(self) -> int:
        current = self._current
        return current.version if current is not None else 0

    def refresh(self) -> bool:
        """Fetch a newer set if there is one; False (and the last set kept) on failure."""
        try:
            fresh = self._source(self.version)
        except Exception as error:  # any failure keeps the last known set in force
            if not self._failing:
                log.warning("cannot refresh access restrictions from %s; the last known set "
                            "stays in force", self._origin,
                            extra={"error": str(error), "version": self.version})
            self._failing = True
            return False
        if self._failing:
            log.info("access restrictions reachable again", extra={"origin": self._origin})
        self._failing = False
        if fresh is not None:
            self._current = fresh
        return True

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="access-restrictions",
                                        daemon=True)
        self._thread.start()

    def wait_loaded(self, stopping: threading.Event, retry_seconds: float = 0.2) -> None:
        """Return once a set is loaded (calls are refused UNAVAILABLE until then), or once
        ``stopping`` is set; asks governance every ``retry_seconds`` meanwhile."""
        while self._current is None and not stopping.is_set():
            self.refresh()
            if self._current is None:
                stopping.wait(retry_seconds)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close()

    def _run(self) -> None:
        while not self._stop.wait(self._refresh_seconds):
            self.refresh()

    def is_suspended(self, principal: Principal) -> bool:
        current = self._current
        return current is not None and (principal.fleet_id, principal.agent_id) in \
            current.suspended

    def check(self, principal: Principal, method: str) -> None:
        """Refuse a revoked token or a suspended agent (unless ``method`` is exempt)."""
        current = self._current
        if current is None:
            raise Unavailable(
                f"this service has not yet loaded the access restrictions from {self._origin} "
                "(revoked tokens, suspended agents); retry shortly",
                reason="ACCESS_RESTRICTIONS_UNKNOWN")
        key = (principal.fleet_id, principal.agent_id)
        if (principal.fleet_id, principal.token_id) in current.revoked_tokens:
            raise Unauthenticated(f"bearer token {principal.token_id} was revoked",
                                  reason="TOKEN_REVOKED")
        cutoff = current.revoked_agents.get(key)
        if cutoff is not None and principal.issued_at <= cutoff:
            raise Unauthenticated(
                f"every token of {principal.agent_id} issued up to {cutoff} was revoked; "
                "ask for a new one", reason="TOKEN_REVOKED")
        if key in current.suspended and method not in self._suspended_may_call:
            raise PermissionDenied(
                f"agent {principal.agent_id} of fleet {principal.fleet_id} is suspended; it "
                "may only read its own trust tier", reason="AGENT_SUSPENDED")


def restrictions_from_proto(reply: gpb.ListAccessRestrictionsResponse) -> Restrictions | None:
    if not reply.changed:
        return None
    return Restrictions(
        version=reply.version,
        revoked_tokens={(t.fleet_id, t.jti): t.expire_time.seconds
                        for t in reply.revoked_tokens},
        revoked_agents={(a.fleet_id, a.agent_id): a.issued_before.seconds
                        for a in reply.revoked_agents},
        suspended=frozenset((a.fleet_id, a.agent_id) for a in reply.suspended_agents))


class GovernanceRestrictionSource:
    """:data:`RestrictionSource` over governance's gRPC API, with this service's token."""

    def __init__(self, address: str, token_file: Path, tls: TlsFiles | None = None,
                 timeout: float = 5.0) -> None:
        self.address = address
        token = token_file.read_text().strip()
        # Governance back after a restart is asked again within RECONNECT_MS, not gRPC's 1-120 s.
        channel = open_channel(address, **(tls or TlsFiles()), reconnect_backoff_ms=RECONNECT_MS,
                               retries=False)
        self._client = GovernanceClient(address, token, timeout=timeout, channel=channel)

    def __call__(self, since_version: int) -> Restrictions | None:
        try:
            reply = self._client.access_restrictions(since_version)
        except EngramRpcError as error:
            raise RuntimeError(f"governance at {self.address}: {error.code.name} "
                               f"{error.reason} {error.message}") from None
        return restrictions_from_proto(reply)

    def close(self) -> None:
        self._client.close()


def governance_restrictions(service: str, address: str | None, token_file: Path | None,
                            tls: TlsFiles, refresh_seconds: float) -> AccessRestrictions | None:
    """Restrictions polled from governance at ``address``; None (and a warning) without one."""
    prefix = f"ENGRAM_{service.upper()}_"
    if not address:
        log.warning("%sGOVERNANCE_ADDR is not set: revoked tokens and suspended agents are NOT "
                    "refused by this %s service", prefix, service)
        return None
    if token_file is None or not token_file.exists():
        raise FileNotFoundError(
            f"{prefix}SERVICE_TOKEN_FILE must name a service token for governance at {address} "
            f"(revocations and suspensions are read from it); got {token_file}")
    source = GovernanceRestrictionSource(address, token_file, tls)
    return AccessRestrictions(source, refresh_seconds=refresh_seconds,
                              origin=f"governance at {address}", close=source.close)
