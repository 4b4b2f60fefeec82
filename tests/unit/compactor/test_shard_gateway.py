"""A shard refusal reaches the compactor's caller with its own code, reason and metadata;
a shard that gives no answer is Unavailable / SHARD_UNAVAILABLE (services.common.outbound)."""

from __future__ import annotations

import grpc
import pytest

from engram.client import EngramRpcError
from services.common.errors import (
    EngramError,
    FailedPrecondition,
    IntegrityError,
    Internal,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from services.compactor.shard_gateway import shard_error


@pytest.mark.parametrize(("code", "reason", "kind", "expected_reason"), [
    (grpc.StatusCode.PERMISSION_DENIED, "GATE_DENIED", PermissionDenied, "GATE_DENIED"),
    (grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED", PermissionDenied, "ROLE_REQUIRED"),
    (grpc.StatusCode.DATA_LOSS, "RECORD_TAMPERED", IntegrityError, "RECORD_TAMPERED"),
    (grpc.StatusCode.INVALID_ARGUMENT, "", InvalidArgument, "INVALID_ARGUMENT"),
    (grpc.StatusCode.FAILED_PRECONDITION, "NO_SUMMARISER", FailedPrecondition, "NO_SUMMARISER"),
    (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_EXPIRED", Unauthenticated, "TOKEN_EXPIRED"),
    (grpc.StatusCode.UNAVAILABLE, "", Unavailable, "SHARD_UNAVAILABLE"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "", Unavailable, "SHARD_UNAVAILABLE"),
    (grpc.StatusCode.UNKNOWN, "", Unavailable, "SHARD_UNAVAILABLE"),
    (grpc.StatusCode.INTERNAL, "", Internal, "INTERNAL"),
])
def test_shard_errors_keep_code_and_reason(code: grpc.StatusCode, reason: str,
                                           kind: type[EngramError], expected_reason: str) -> None:
    error = shard_error("127.0.0.1:1", EngramRpcError(code, "refused", reason,
                                                       {"rule_ids": "r-1,r-2"}))
    assert type(error) is kind
    assert error.reason == expected_reason
    assert error.metadata == {"rule_ids": "r-1,r-2"}
    assert error.message.startswith("shard service at 127.0.0.1:1") and "refused" in error.message
