"""Domain exceptions shared by every Engram service.

Each exception declares the gRPC status it maps to; the error interceptor in
``services.common.interceptors`` turns it into a ``google.rpc.Status`` with an
``ErrorInfo{reason, domain, metadata}`` detail. Domain code raises these and
never imports grpc.

    EngramError
    ├── InvalidArgument        INVALID_ARGUMENT
    ├── NotFound               NOT_FOUND
    ├── AlreadyExists          ALREADY_EXISTS
    ├── FailedPrecondition     FAILED_PRECONDITION
    ├── Aborted                ABORTED
    ├── Unauthenticated        UNAUTHENTICATED
    ├── PermissionDenied       PERMISSION_DENIED
    ├── ResourceExhausted      RESOURCE_EXHAUSTED
    ├── IntegrityError         DATA_LOSS
    ├── Unavailable            UNAVAILABLE
    └── Internal               INTERNAL
"""

from __future__ import annotations

from collections.abc import Mapping

ERROR_DOMAIN = "engram.dev"


class EngramError(Exception):
    """Base class. ``code`` is the name of a ``grpc.StatusCode`` member; ``retry_delay``
    (seconds), when set, travels as ``google.rpc.RetryInfo``: when a retry may succeed."""

    code = "UNKNOWN"
    default_reason = "ENGRAM_ERROR"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_delay = retry_delay


class InvalidArgument(EngramError):
    code = "INVALID_ARGUMENT"
    default_reason = "INVALID_ARGUMENT"


class NotFound(EngramError):
    code = "NOT_FOUND"
    default_reason = "NOT_FOUND"


class AlreadyExists(EngramError):
    code = "ALREADY_EXISTS"
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(EngramError):
    code = "FAILED_PRECONDITION"
    default_reason = "FAILED_PRECONDITION"


class Aborted(EngramError):
    """A concurrency conflict the caller may retry (nothing was stored)."""

    code = "ABORTED"
    default_reason = "ABORTED"


class DeadlineExceeded(EngramError):
    """A call that waited past a limit of the service's own (an upload that stopped sending)."""

    code = "DEADLINE_EXCEEDED"
    default_reason = "DEADLINE_EXCEEDED"


class Unauthenticated(EngramError):
    code = "UNAUTHENTICATED"
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(EngramError):
    code = "PERMISSION_DENIED"
    default_reason = "PERMISSION_DENIED"


class ResourceExhausted(EngramError):
    code = "RESOURCE_EXHAUSTED"
    default_reason = "RESOURCE_EXHAUSTED"


class IntegrityError(EngramError):
    """Stored data no longer matches its hash (tampering or corruption)."""

    code = "DATA_LOSS"
    default_reason = "INTEGRITY_CHECK_FAILED"


class Unavailable(EngramError):
    code = "UNAVAILABLE"
    default_reason = "DEPENDENCY_UNAVAILABLE"


class Internal(EngramError):
    code = "INTERNAL"
    default_reason = "INTERNAL"
