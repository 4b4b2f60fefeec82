"""Protobuf Timestamps read as integers, refused when a store could not hold them.

``Timestamp.ToMicroseconds`` raises ``ValueError`` outside 0001..9999 (an INTERNAL error if
it escapes); every service reads a client's times through :func:`time_us` instead.
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from services.common.errors import InvalidArgument

MIN_TIME_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z, RFC 3339's first instant
MAX_TIME_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
MAX_CLOCK_SKEW_US = 5 * 60 * 1_000_000
"""How far past this instance's clock an imported item may be dated (another instance's
clock ran ahead); further is refused: it would count in every rate window from now on."""


def time_us(ts: Timestamp, name: str, reason: str = "INVALID_TIMESTAMP") -> int:
    """``ts`` in microseconds since 1970; ``InvalidArgument`` (``reason``) outside 0001..9999
    or with nanos out of range."""
    if not 0 <= ts.nanos < 1_000_000_000:
        raise InvalidArgument(f"{name} has nanos out of range", reason=reason)
    us = ts.seconds * 1_000_000 + ts.nanos // 1000
    if not MIN_TIME_US <= us <= MAX_TIME_US:
        raise InvalidArgument(f"{name} is outside 0001..9999", reason=reason)
    return us
