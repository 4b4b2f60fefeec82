"""A failed call to another service maps to this service's error in one place."""

import grpc
import pytest

from engram.client import EngramRpcError
from services.common.errors import (
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from services.common.outbound import dependency_error


@pytest.mark.parametrize(("code", "kind"), [
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
    (grpc.StatusCode.PERMISSION_DENIED, PermissionDenied),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
])
def test_a_refusal_keeps_its_code_reason_and_metadata(code: grpc.StatusCode, kind: type) -> None:
    error = dependency_error("shard", "127.0.0.1:1",
                             EngramRpcError(code, "no", "SOME_REASON", {"k": "v"}))
    assert type(error) is kind
    assert (error.reason, error.metadata) == ("SOME_REASON", {"k": "v"})
    assert error.message.startswith("shard service at 127.0.0.1:1: no")


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN])
def test_no_answer_is_unavailable_with_the_service_named(code: grpc.StatusCode) -> None:
    error = dependency_error("governance", "127.0.0.1:1", EngramRpcError(code, "down"))
    assert isinstance(error, Unavailable)
    assert error.reason == "GOVERNANCE_UNAVAILABLE"
    assert "governance service at 127.0.0.1:1" in error.message


def test_a_refused_token_names_the_setting_to_check() -> None:
    error = dependency_error("shard", "a:1", EngramRpcError(grpc.StatusCode.UNAUTHENTICATED, "bad"),
                             credential_hint="ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE")
    assert isinstance(error, Unauthenticated)
    assert "ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE" in error.message


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE])
def test_the_retry_delay_a_dependency_asked_for_is_passed_on(code: grpc.StatusCode) -> None:
    """A dependency that said when to retry (RetryInfo): this service's caller is told the
    same, not left to guess (the gate dropped governance's delay before)."""
    error = dependency_error("governance", "127.0.0.1:1",
                             EngramRpcError(code, "busy", "BUSY", retry_delay=2.5))
    assert error.retry_delay == 2.5
