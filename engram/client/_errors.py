"""Client-side view of a failed call: gRPC code, ErrorInfo reason, readable message."""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

_STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""Trailer holding the serialized google.rpc.Status (what grpcio-status reads, decoded here)."""


class EngramRpcError(Exception):
    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}" + (f" [{reason}]" if reason else ""))
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        self.retry_delay = retry_delay
        """Seconds the server asked the caller to wait before a retry (``RetryInfo``)."""

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> EngramRpcError:
        if not isinstance(error, grpc.Call):
            return cls(grpc.StatusCode.UNKNOWN, str(error))
        reason, metadata = "", dict[str, str]()
        retry_delay: float | None = None
        status = _status(error)
        if status is not None:
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    reason, metadata = info.reason, dict(info.metadata)
                elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    retry = error_details_pb2.RetryInfo()
                    detail.Unpack(retry)
                    retry_delay = retry.retry_delay.ToNanoseconds() / 1e9
        return cls(error.code(), error.details() or "", reason, metadata, retry_delay)


def _status(call: grpc.Call) -> status_pb2.Status | None:
    """The google.rpc.Status a service attached to a failed call, if any and if its code is
    the call's."""
    for key, value in call.trailing_metadata() or ():
        if key != _STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            return None
        return status if status.code == call.code().value[0] else None
    return None
