"""Failures as ``google.rpc.Status`` JSON with the HTTP status of their gRPC code."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

ERROR_DOMAIN = "engram.dev"
_STATUS_DETAILS_KEY = "grpc-status-details-bin"

# The standard mapping (google/rpc/code.proto, and what Envoy and grpc-gateway answer).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


def status_of(code: grpc.StatusCode, message: str, reason: str = "",
              metadata: dict[str, str] | None = None) -> status_pb2.Status:
    """A Status made here (the gateway's own refusals), with an ErrorInfo when there is a
    reason."""
    status = status_pb2.Status(code=code.value[0], message=message)
    if reason:
        status.details.add().Pack(error_details_pb2.ErrorInfo(
            reason=reason, domain=ERROR_DOMAIN, metadata=metadata or {}))
    return status


def status_from_rpc_error(error: grpc.aio.AioRpcError | grpc.RpcError,
                          backend: str = "") -> status_pb2.Status:
    """The Status the service attached (its ErrorInfo included), else one from the code and
    message alone. A failure the channel made itself (the service down or slow) says which
    service, not the channel's text, which names internal addresses."""
    if not isinstance(error, grpc.aio.AioRpcError | grpc.Call):
        return status_of(grpc.StatusCode.UNKNOWN, "the call failed")
    code = error.code()
    trailers: Any = error.trailing_metadata() or ()
    for key, value in trailers:
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            try:
                status = status_pb2.Status.FromString(value)
            except DecodeError:
                break
            if status.code == code.value[0]:
                return status
    if code in _CHANNEL_FAILURES and backend:
        reason, text = _CHANNEL_FAILURES[code]
        return status_of(code, f"the {backend} service {text}", reason,
                         {"service": backend})
    return status_of(code, error.details() or code.name)


_CHANNEL_FAILURES = {
    grpc.StatusCode.UNAVAILABLE: ("SERVICE_UNAVAILABLE", "is unavailable; retry later"),
    grpc.StatusCode.DEADLINE_EXCEEDED: ("DEADLINE_EXCEEDED", "did not answer in time"),
}


def http_status(status: status_pb2.Status) -> int:
    for code, http in HTTP_STATUS.items():
        if code.value[0] == status.code:
            return http
    return 500


def status_json(status: status_pb2.Status) -> dict[str, Any]:
    """``{"code", "message", "details": [{"@type": ..., ...}]}``; a detail of a type this
    process does not know is left out rather than failing the answer."""
    known = status_pb2.Status(code=status.code, message=status.message)
    for detail in status.details:
        if detail.TypeName() in _KNOWN_DETAILS:
            known.details.add().CopyFrom(detail)
    document: dict[str, Any] = json_format.MessageToDict(known)
    document.setdefault("code", status.code)
    document.setdefault("message", status.message)
    document.setdefault("details", [])
    return document


_KNOWN_DETAILS = frozenset(
    message.DESCRIPTOR.full_name for message in (
        error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo,
        error_details_pb2.DebugInfo, error_details_pb2.QuotaFailure,
        error_details_pb2.PreconditionFailure, error_details_pb2.ResourceInfo,
        error_details_pb2.Help, error_details_pb2.LocalizedMessage, error_details_pb2.RequestInfo,
    )
)
