"""Reading a recorded erasure from governance (docs/erasure.md): every service that holds
erasable data erases only what governance's chain lists, read with the service's own token."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from engram.client import EngramRpcError, TlsFiles
from engram.client._channel import open_channel
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from services.common.access import RECONNECT_MS
from services.common.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from services.common.outbound import dependency_error
from services.common.tokens import validate_identifier

T = TypeVar("T")

MAX_ERASURE_ITEMS = 10_000
"""Items one erasure lists (governance refuses more); selections are pages of at most this."""
DEFAULT_SELECTION = 1000
ERASURE_ID = re.compile(r"era_[0-9a-f]{28}")
"""The form of every erasure id governance issues or imports (``era_`` and 28 lowercase hex
digits; ``services.governance.domain.erasures.check_erasure_id``)."""


MAX_RUN_ITEM = 2**63 - 1
"""The largest event seq or iteration number a store holds (a signed 64-bit INTEGER)."""


def run_item_key(item_id: str) -> tuple[str, int]:
    """An ``event`` or ``iteration`` item's ``<run_id>:<n>`` as (run id, n); governance checked
    the form. An n no store can hold (an erasure recorded or imported before governance refused
    one) is 0: nothing has it, so the item is not found rather than failing the lookup inside
    the driver."""
    run_id, _, number = item_id.rpartition(":")
    value = int(number) if number.isascii() and number.isdigit() else 0
    return run_id, value if 1 <= value <= MAX_RUN_ITEM else 0


def is_erasure_id(erasure_id: str) -> bool:
    """Whether ``erasure_id`` has the form governance gives erasure ids: a tombstone naming
    anything else names no erasure (it was not made by one)."""
    return bool(ERASURE_ID.fullmatch(erasure_id))


class PurgeThrottle:
    """When an erasure call purges (SQLite WAL truncate and FTS optimize, Postgres VACUUM).

    Always while a purge is owed: something was erased and committed (:meth:`owe`, called
    right after the commit) and no purge that began after it has succeeded yet. Only a purge
    that succeeded settles what is owed: one that raised (WAL_BUSY: a reader held the WAL) or
    was never reached (a later item refused, a blob store down) leaves it owed, so the rerun
    the error asks for purges even though it erases nothing new. Otherwise, to finish a call
    interrupted after its commit (a crash: this process does not know), at most once per
    ``interval_s`` (a rerun of an erasure id that erases nothing must not make every fleet pay
    a whole-store purge on each call)."""

    def __init__(self, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._owed = 0
        """Commits that erased something, counted; a purge that succeeded settles those counted
        before it began (:attr:`_settled`)."""
        self._settled = 0
        self._lock = threading.Lock()
        self._running = threading.Lock()
        """One purge at a time: a call that finds one running waits for it, then purges only if
        something is still owed (the same erasure carried out twice at once purges once)."""

    def owe(self) -> None:
        """Something erased was just committed: its old pages wait for a purge."""
        with self._lock:
            self._owed += 1

    def purge(self, purge: Callable[[], None]) -> bool:
        """Run ``purge`` when due (True when it ran and succeeded); what it raises propagates
        and the purge stays owed."""
        with self._running:
            with self._lock:
                owed = self._owed
                now = self._clock()
                if not (owed > self._settled or self._last is None
                        or now - self._last >= self._interval_s):
                    return False
            purge()
            with self._lock:
                self._settled = max(self._settled, owed)
                self._last = self._clock()
            return True


class TextScans:
    """Whole-fleet text scans (``forget --match``: FindRuns, FindIterationLogs, ForgetRecords
    by match) read every record or blob of a fleet. At most ``slots`` run at once in a process
    (another is RESOURCE_EXHAUSTED at once, SCAN_BUSY: a fleet's governor cannot hold every
    worker), and each stops when its caller has gone (deadline passed or cancelled)."""

    def __init__(self, slots: int = 2) -> None:
        self._slots = threading.BoundedSemaphore(slots)

    @contextmanager
    def slot(self, what: str) -> Iterator[None]:
        if not self._slots.acquire(blocking=False):
            raise ResourceExhausted(f"{what}: other scans of the whole store are running on "
                                    "this replica; retry in a moment", reason="SCAN_BUSY")
        try:
            yield
        finally:
            self._slots.release()


def still_wanted(active: Callable[[], bool]) -> None:
    """Between the items of a scan: stop when the caller has gone."""
    if not active():
        raise Aborted("the caller went away (deadline or cancel): the scan stopped",
                      reason="SCAN_ABANDONED")


def while_wanted(items: Iterable[T], active: Callable[[], bool]) -> Iterator[T]:
    """``items``, each once the caller is found still there (:func:`still_wanted`)."""
    for item in items:
        still_wanted(active)
        yield item


def selection_limit(limit: int) -> int:
    """A selection's page size: 0 means the default; INVALID_ARGUMENT outside 1..the most."""
    limit = limit or DEFAULT_SELECTION
    if not 1 <= limit <= MAX_ERASURE_ITEMS:
        raise InvalidArgument(f"limit must be 1..{MAX_ERASURE_ITEMS}, got {limit}",
                              reason="INVALID_LIMIT")
    return limit


@dataclass(frozen=True)
class ErasureOrder:
    """An erasure governance recorded: a service erases exactly the items it lists."""

    erasure_id: str
    fleet_id: str
    requested_by: str
    items: tuple[tuple[str, str, str], ...]
    """``(kind, id, leaf_hash)``; kind ``record``, ``summary`` or ``run``."""
    imported: bool = False
    """Recorded by another governance (a bundle's): its runs stay erased here even where this
    service never held them."""

    def ids(self, *kinds: str) -> list[str]:
        return [item_id for kind, item_id, _ in self.items if kind in kinds]

    def require_fleet(self, fleet_id: str) -> None:
        if self.fleet_id != fleet_id:  # as governance answers it: absent, nothing of its fleet
            raise NotFound(f"no erasure {self.erasure_id} in fleet {fleet_id}",
                           reason="ERASURE_NOT_FOUND")


class ErasureSource(Protocol):
    def erasure(self, erasure_id: str) -> ErasureOrder:
        """The recorded erasure; NotFound if governance has none of that id, Unavailable when
        it cannot be asked."""
        ...


def order_from_proto(found: gpb.Erasure) -> ErasureOrder:
    return ErasureOrder(found.erasure_id, found.fleet_id, found.requested_by,
                        tuple((i.kind, i.id, i.leaf_hash) for i in found.items), found.imported)


def recorded_erasure(source: ErasureSource | None, service: str, erasure_id: str,
                     fleet_id: str) -> ErasureOrder:
    """The erasure governance recorded under ``erasure_id``, which must be of ``fleet_id``:
    what a service may erase. FAILED_PRECONDITION when this service cannot ask governance."""
    validate_identifier("erasure_id", erasure_id)
    if source is None:
        raise FailedPrecondition(
            f"this {service} service has no governance address (ENGRAM_{service.upper()}_"
            "GOVERNANCE_ADDR), and governance records erasures: nothing can be erased here",
            reason="GOVERNANCE_REQUIRED")
    order = source.erasure(erasure_id)
    order.require_fleet(fleet_id)
    return order


class GovernanceErasures:
    """ErasureSource over governance's gRPC API with this service's token."""

    def __init__(self, address: str, token_file: Path, tls: TlsFiles | None = None,
                 timeout: float = 10.0) -> None:
        self.address = address
        channel = open_channel(address, **(tls or TlsFiles()), reconnect_backoff_ms=RECONNECT_MS)
        self._client = GovernanceClient(address, token_file.read_text().strip(),
                                        timeout=timeout, channel=channel)

    def erasure(self, erasure_id: str) -> ErasureOrder:
        try:
            return order_from_proto(self._client.erasure(erasure_id))
        except EngramRpcError as error:
            raise dependency_error("governance", self.address, error) from None

    def close(self) -> None:
        self._client.close()


def governance_erasures(address: str | None, token_file: Path | None,
                        tls: TlsFiles) -> GovernanceErasures | None:
    """None without a governance address (the service then erases nothing)."""
    if not address or token_file is None or not token_file.exists():
        return None
    return GovernanceErasures(address, token_file, tls)
