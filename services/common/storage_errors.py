"""Storage failures a client can act on, told apart from bugs.

A full disk, a quota, a read-only or failing volume, or a database that went away surface
from deep inside a write (an ``OSError`` from the blob store or the warm log, a driver error
wrapped by SQLAlchemy). :func:`storage_error` finds such a cause anywhere in an exception's
chain and names it as an :class:`EngramError`, so the caller gets RESOURCE_EXHAUSTED with
reason ``STORAGE_FULL`` or UNAVAILABLE, never INTERNAL; the error
interceptor applies it to every RPC of every service.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

from services.common.errors import EngramError, ResourceExhausted, Unavailable

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# SQLite's own words for SQLITE_FULL and SQLITE_IOERR / SQLITE_READONLY.
_SQLITE_FULL = ("database or disk is full",)
_SQLITE_IO = ("disk i/o error",)
_SQLITE_READONLY = ("attempt to write a readonly database",)
_PG_DISK_FULL = "53100"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__, getattr(current, "orig", None)]


def storage_error(exc: BaseException) -> EngramError | None:
    """The client-facing error for a storage failure in ``exc``'s chain, or None."""
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.errno is not None:
            where = f" ({cause.filename})" if cause.filename else ""
            if cause.errno in _FULL_ERRNOS:
                return _full(f"no space left on the service's volume{where}")
            if cause.errno == errno.EROFS:
                return Unavailable(f"the service's volume is read-only{where}",
                                   reason="STORAGE_READ_ONLY")
            if cause.errno == errno.EIO:
                return Unavailable(f"I/O error on the service's volume{where}",
                                   reason="STORAGE_IO_ERROR")
        sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if sqlstate == _PG_DISK_FULL:
            return _full("the database server is out of disk space")
        if type(cause).__module__.startswith("psycopg") and (
                type(cause).__name__ == "OperationalError"
                or str(sqlstate or "").startswith(("08", "57P"))):
            # The server went away, refuses connections or is shutting down: try again later.
            return Unavailable("the service's database is unavailable; retry later",
                               reason="DATABASE_UNAVAILABLE")
        if type(cause).__module__ == "sqlite3":
            text = str(cause).lower()
            if any(marker in text for marker in _SQLITE_FULL):
                return _full("no space left for the database")
            if any(marker in text for marker in _SQLITE_IO):
                return Unavailable("I/O error on the database file", reason="STORAGE_IO_ERROR")
            if any(marker in text for marker in _SQLITE_READONLY):
                return Unavailable("the database file is read-only", reason="STORAGE_READ_ONLY")
    return None


def _full(what: str) -> ResourceExhausted:
    # No retry delay: the SDK would wait and retry on its own, and a disk that is full now is
    # not likely to have room in a few seconds; the caller (or its operator) decides.
    return ResourceExhausted(f"storage full: {what}; nothing was stored. Free space, then retry",
                             reason="STORAGE_FULL")


def outcome_known(exc: BaseException) -> bool:
    """Whether a failed write surely stored nothing, so its jobs may be tried again one by one
    (GroupCommit's ``alone_after``): not after a storage failure, which may have come after
    the commit (a connection lost before its acknowledgement), and would fail them again."""
    return storage_error(exc) is None
