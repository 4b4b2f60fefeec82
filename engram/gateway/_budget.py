"""How many bytes of JSON request bodies the gateway holds at once (found by review on
2026-11-29: an authenticated caller could send any number of 8 MiB bodies at once, each read
whole into memory and parsed, several hundred MB a body parsed; nothing bounded how many).

A body takes its bytes as they arrive and gives them back once its request message is built
(parsed): one token holds at most ``per_token`` bytes (one more piece is 429 RESOURCE_EXHAUSTED
``BODY_LIMIT``), the gateway at most ``total`` (503 UNAVAILABLE ``BODIES_BUSY``); both say
``Retry-After: 1`` and store nothing. Everything runs on the event loop: no lock.
"""

from __future__ import annotations

import hashlib
from typing import Any

import grpc

from engram.gateway._errors import status_of

UNVERIFIED = b"unverified"
"""The one holder of every body whose bearer token the gateway could not verify."""


class BodyRefused(Exception):
    """A body that would pass a budget: its status (and the Retry-After the answer carries)."""

    def __init__(self, status: Any) -> None:
        super().__init__(status.message)
        self.status = status


class BodyBudget:
    def __init__(self, total: int, per_token: int, unverified: int | None = None) -> None:
        """``unverified``: what the :data:`UNVERIFIED` holder (every token the gateway could
        not verify) holds at most, less than a token's so that it and one token together
        leave room for others (found by review); ``per_token`` when not given."""
        unverified = per_token if unverified is None else unverified
        if not 1 <= per_token <= total or not 1 <= unverified <= per_token:
            raise ValueError(f"a token's body budget must be 1..{total} bytes (the gateway's) "
                             f"and the unverified one 1..{per_token}, got {per_token} and "
                             f"{unverified}")
        self.total, self.per_token, self.unverified = total, per_token, unverified
        self.held = 0
        self._by_token: dict[bytes, int] = {}

    def lease(self, holder: bytes) -> BodyLease:
        return BodyLease(self, holder)

    def _take(self, holder: bytes, size: int) -> None:
        mine = self._by_token.get(holder, 0)
        limit = self.unverified if holder == UNVERIFIED else self.per_token
        if mine + size > limit:
            raise BodyRefused(status_of(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"this token's request bodies being received "
                f"or parsed would pass {limit} bytes at once; retry when one is done",
                "BODY_LIMIT", {"limit_bytes": str(limit)}))
        if self.held + size > self.total:
            raise BodyRefused(status_of(
                grpc.StatusCode.UNAVAILABLE, f"the gateway holds {self.held} bytes of request "
                f"bodies, the most it takes at once is {self.total}; retry in a moment",
                "BODIES_BUSY", {"limit_bytes": str(self.total)}))
        self._by_token[holder] = mine + size
        self.held += size

    def _give(self, holder: bytes, size: int) -> None:
        self.held -= size
        left = self._by_token.get(holder, 0) - size
        if left > 0:
            self._by_token[holder] = left
        else:
            self._by_token.pop(holder, None)


class BodyLease:
    """One body's bytes held in a :class:`BodyBudget`; :meth:`release` gives them all back."""

    def __init__(self, budget: BodyBudget, holder: bytes) -> None:
        self._budget, self._holder = budget, holder
        self.size = 0

    def take(self, size: int) -> None:
        if size <= 0:  # Starlette ends every body with b"": no entry for nothing
            return
        self._budget._take(self._holder, size)
        self.size += size

    def release(self) -> None:
        if self.size:
            self._budget._give(self._holder, self.size)
            self.size = 0


def token_holder(authorization: str) -> bytes:
    """Whose upload or body this is: the token as the services read it (scheme in any case, spaces
    around the token ignored), and of a JWT only what its signature signs, ``header.payload``
    (the claims, jti included), byte for byte. Each token has exactly one, which nobody can
    change without the signing key; the signature's own spelling can vary (PyJWT accepts it
    with ``==`` padding appended, older versions more), and each spelling counted as another
    holder. A made-up signature gains nothing: the service refuses it at once."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return hashlib.sha256(authorization.encode()).digest()
    token = token.strip()
    signed, dot, _signature = token.rpartition(".")
    return hashlib.sha256((signed if dot and "." in signed else token).encode()).digest()
