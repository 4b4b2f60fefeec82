"""Calls from one service to another: their failures mapped to this service's errors, once.

A dependency's refusal keeps its code, reason and metadata (its caller sent something wrong,
or is not allowed); a dependency that did not answer (down, deadline, cancelled, an unknown
failure) is ``Unavailable`` with ``<SERVICE>_UNAVAILABLE``, so a client retries it and nothing
is taken as done. The gate and the compactor's shard gateway both go through here.
"""

from __future__ import annotations

import grpc

from engram.client import EngramRpcError
from services.common.errors import (
    Aborted,
    AlreadyExists,
    EngramError,
    FailedPrecondition,
    IntegrityError,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

_KEPT: dict[grpc.StatusCode, type[EngramError]] = {
    grpc.StatusCode[cls.code]: cls for cls in (
        InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Aborted, Unauthenticated,
        PermissionDenied, ResourceExhausted, IntegrityError, Internal)}

_NO_ANSWER = {grpc.StatusCode.UNAVAILABLE: "is unreachable",
              grpc.StatusCode.DEADLINE_EXCEEDED: "did not answer within the deadline",
              grpc.StatusCode.CANCELLED: "cancelled the call",
              grpc.StatusCode.UNKNOWN: "failed without a status"}


def dependency_error(service: str, address: str, error: EngramRpcError, *,
                     credential_hint: str = "") -> EngramError:
    """The error to raise when a call to ``service`` at ``address`` failed with ``error``.

    ``credential_hint`` names the setting that holds this service's token for that
    dependency; it is added to UNAUTHENTICATED answers, which mean a deployment mistake.
    """
    message = f"{service} service at {address}: {error.message}"
    kind = _KEPT.get(error.code)
    if kind is not None:
        if error.code == grpc.StatusCode.UNAUTHENTICATED and credential_hint:
            message += f" (it refused this service's token: check {credential_hint})"
        return kind(message, reason=error.reason or None, metadata=error.metadata,
                    retry_delay=error.retry_delay)
    what = _NO_ANSWER.get(error.code, f"answered {error.code.name}")
    return Unavailable(f"{service} service at {address} {what}: {error.message}",
                       reason=error.reason or f"{service.upper()}_UNAVAILABLE",
                       metadata=error.metadata, retry_delay=error.retry_delay)
