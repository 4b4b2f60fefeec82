"""The compactor's inputs have limits: deep JSON, NUL bytes, odd run ids, forged page tokens."""

from __future__ import annotations

import base64
import hashlib
import json

import grpc
import pytest

from engram.client import EngramRpcError
from engram.compactor.v1 import compactor_service_pb2 as pb
from tests.integration.compactor.conftest import CompactorFactory
from tests.integration.compactor.test_compactor_contract import iteration


def _refused(call, reason: str) -> EngramRpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(EngramRpcError) as caught:
        call()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert caught.value.reason == reason, caught.value
    return caught.value


@pytest.mark.parametrize("field", ["detail_json", "guardrails_json"])
def test_json_nested_5000_deep_is_refused_naming_the_setting(
        compactor_for: CompactorFactory, field: str) -> None:
    client = compactor_for()
    deep = iteration(1)
    setattr(deep, field, "[" * 5000 + "]" * 5000)
    error = _refused(lambda: client.record("run-deep", deep), "LIMIT_EXCEEDED")
    assert "ENGRAM_LIMITS_JSON_DEPTH" in error.message and field in error.message
    assert client.record("run-deep", iteration(1)).summary.iteration == 1  # nothing was stored


def test_nul_bytes_and_dot_run_ids_are_refused(compactor_for: CompactorFactory) -> None:
    client = compactor_for()
    bad = iteration(1)
    bad.status = "success\x00"
    _refused(lambda: client.record("run-nul", bad), "NUL_CHARACTER")
    bad = iteration(1)
    bad.detail_json = '{"note": "a\\u0000b"}'  # JSON's escaped NUL is data, not a NUL byte
    assert client.record("run-nul", bad).created
    _refused(lambda: client.record("run-nul", iteration(2), request_id="a\x01"),
             "INVALID_REQUEST_ID")
    for run_id in ("..", ".", "run\x01", "run/1"):
        with pytest.raises(EngramRpcError) as caught:
            client.record(run_id, iteration(1))
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_forged_and_other_callers_page_tokens_are_refused(
        compactor_for: CompactorFactory) -> None:
    alice, bob = compactor_for("alice"), compactor_for("bob")
    for n in range(1, 6):
        alice.record("run-p", iteration(n))
    filters = {"run": "run-p", "fleet": "fleet-a", "start": 0}
    digest = hashlib.sha256(json.dumps(filters, sort_keys=True, separators=(",", ":"))
                            .encode()).hexdigest()[:16]
    forged = base64.urlsafe_b64encode(
        json.dumps({"k": ["x"], "f": digest}).encode()).decode().rstrip("=")

    def page(client, token: str) -> pb.ListSummariesResponse:  # type: ignore[no-untyped-def]
        return client.call(client.stub.ListSummaries, pb.ListSummariesRequest(
            run_id="run-p", page_size=2, page_token=token))

    _refused(lambda: page(alice, forged), "INVALID_PAGE_TOKEN")
    token = page(alice, "").next_page_token
    assert [s.iteration for s in page(alice, token).summaries] == [3, 4]
    _refused(lambda: page(bob, token), "INVALID_PAGE_TOKEN")
