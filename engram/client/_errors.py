"""Client-side view of a failed call: gRPC code, ErrorInfo reason, readable message."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


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
        code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
        message = error.details() if isinstance(error, grpc.Call) else str(error)
        reason, metadata = "", dict[str, str]()
        retry_delay: float | None = None
        status = rpc_status.from_call(error) if isinstance(error, grpc.Call) else None
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
        return cls(code, message or "", reason, metadata, retry_delay)
