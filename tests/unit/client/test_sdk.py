"""The typed SDK: keyword parameters checked before a call, refusals as EngramRpcError,
one pager for every List call, settings from the environment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.client import BaseClient, ClientSettings, EngramRpcError, ShardClient
from engram.shard.v1 import shard_service_pb2 as pb
from engram.shard.v1 import shard_service_pb2_grpc as pb_grpc
from tests.unit.client.conftest import Serve


class Shard(pb_grpc.ShardServiceServicer):
    """Keeps what it was sent; refuses importance above 1 the way the shard does."""

    def __init__(self) -> None:
        self.received: list[pb.CreateRecordRequest] = []

    def CreateRecord(self, request: pb.CreateRecordRequest,
                     context: grpc.ServicerContext) -> pb.CreateRecordResponse:
        self.received.append(request)
        if request.record.importance > 1:
            _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "importance must be between 0 "
                    f"and 1, got {request.record.importance}", "IMPORTANCE_OUT_OF_RANGE")
        return pb.CreateRecordResponse(record=pb.Record(id="r1", content=request.record.content),
                                       created=True)


def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, message: str,
            reason: str) -> None:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="engram.dev",
                                            metadata={"field": "importance"}))
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
    context.abort(code, message)


@pytest.fixture
def shard(serve: Serve) -> Iterator[tuple[ShardClient, Shard]]:
    servicer = Shard()
    with ShardClient(serve(pb_grpc.add_ShardServiceServicer_to_server, servicer), "t") as client:
        yield client, servicer


def test_add_sends_every_keyword_it_takes(shard: tuple[ShardClient, Shard]) -> None:
    client, servicer = shard
    reply = client.add("Lesson learned: pin dependencies", run_id="run-1", domain="insights",
                       source="manual", importance=0.75, tags=("ops", "deps"),
                       metadata={"ticket": "T-1"}, request_id="req-1")
    assert reply.created and reply.record.content == "Lesson learned: pin dependencies"
    [request] = servicer.received
    assert request.request_id == "req-1"
    record = request.record
    assert (record.run_id, record.domain, record.source) == ("run-1", "insights", "manual")
    assert record.HasField("importance") and record.importance == 0.75
    assert list(record.tags) == ["ops", "deps"] and dict(record.metadata) == {"ticket": "T-1"}
    client.add("no importance given")
    assert not servicer.received[-1].record.HasField("importance")  # the shard's 0.5 applies


@pytest.mark.parametrize(("keywords", "named"), [
    ({"tags": "ops"}, "tags"),
    ({"importance": "high"}, "importance"),
    ({"metadata": {"ticket": 7}}, "metadata"),
    ({"run_id": 42}, "run_id"),
])
def test_add_with_a_value_of_the_wrong_type_names_it_and_sends_nothing(
        shard: tuple[ShardClient, Shard], keywords: dict[str, object], named: str) -> None:
    client, servicer = shard
    with pytest.raises(TypeError, match=named):
        client.add("text", **keywords)  # type: ignore[arg-type]
    assert servicer.received == []


def test_add_with_an_unknown_keyword_is_a_type_error(shard: tuple[ShardClient, Shard]) -> None:
    client, servicer = shard
    with pytest.raises(TypeError, match="importanc"):
        client.add("text", importanc=0.5)  # type: ignore[call-arg]
    assert servicer.received == []


def test_add_refused_by_the_shard_carries_code_reason_and_metadata(
        shard: tuple[ShardClient, Shard]) -> None:
    client, _ = shard
    with pytest.raises(EngramRpcError) as refused:
        client.add("text", importance=3.0)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.reason == "IMPORTANCE_OUT_OF_RANGE"
    assert refused.value.metadata == {"field": "importance"}
    assert str(refused.value) == ("INVALID_ARGUMENT: importance must be between 0 and 1, "
                                  "got 3.0 [IMPORTANCE_OUT_OF_RANGE]")


def test_search_with_an_unknown_mode_names_the_choices(shard: tuple[ShardClient, Shard]) -> None:
    client, _ = shard
    with pytest.raises(ValueError, match="lexical, semantic, hybrid"):
        client.search("anything", mode="fuzzy")


def test_paginate_follows_page_tokens_until_the_last_page() -> None:
    pages = {"": (["r1", "r2"], "p2"), "p2": (["r3"], "p3"), "p3": ([], "")}
    asked: list[tuple[str, int]] = []

    def list_runs(request: apb.ListRunsRequest, timeout: float | None = None,
                  metadata: tuple[tuple[str, str], ...] | None = None) -> apb.ListRunsResponse:
        asked.append((request.page_token, request.page_size))
        ids, token = pages[request.page_token]
        return apb.ListRunsResponse(runs=[apb.Run(run_id=i) for i in ids], next_page_token=token)

    client = BaseClient("unused", "t", channel=grpc.insecure_channel("127.0.0.1:1"))
    runs = client.paginate(list_runs, apb.ListRunsRequest(page_size=2), lambda r: r.runs)
    assert [run.run_id for run in runs] == ["r1", "r2", "r3"]
    assert asked == [("", 2), ("p2", 2), ("p3", 2)]
    client.close()


def test_settings_read_the_environment_and_endpoints_json(tmp_path: Path) -> None:
    (tmp_path / "endpoints.json").write_text(json.dumps(
        {"shard": "10.0.0.1:1", "governance": "10.0.0.2:2", "unknown": "x"}))
    settings = ClientSettings({"ENGRAM_HOME": str(tmp_path), "ENGRAM_GOVERNANCE_ADDR": "gov:9",
                               "engram_artifacts_target": "art:8", "ENGRAM_TLS_CA": "",
                               "ENGRAM_TIMEOUT_SECONDS": "2.5"})
    assert settings.shard_addr == "10.0.0.1:1"  # from `engram up`'s endpoints.json
    assert settings.governance_addr == "gov:9"  # the environment wins
    assert settings.artifacts_addr == "art:8"  # _TARGET, any case
    assert settings.compactor_addr == "127.0.0.1:50054"
    assert settings.tls() == {"tls_ca": None, "tls_cert": None, "tls_key": None}
    assert settings.timeout_seconds == 2.5 and settings.token is None
    with pytest.raises(FileNotFoundError, match="ENGRAM_TOKEN"):
        settings.resolve_token()
    (tmp_path / "auth").mkdir()
    (tmp_path / "auth" / "admin.token").write_text("admin-token\n")
    assert settings.resolve_token() == "admin-token"
    assert ClientSettings({"ENGRAM_TOKEN": "mine"}).resolve_token() == "mine"
    # a Kubernetes Secret made --from-file keeps the newline; gRPC refused it as metadata
    assert ClientSettings({"ENGRAM_TOKEN": "mine\n"}).resolve_token() == "mine"
    assert ClientSettings({"ENGRAM_TOKEN": " \n"}).token is None


def test_settings_refuse_a_timeout_that_is_not_a_number() -> None:
    for bad in ("soon", "0", "-5", "nan", "inf"):
        with pytest.raises(ValueError, match="ENGRAM_TIMEOUT_SECONDS must be a positive"):
            ClientSettings({"ENGRAM_TIMEOUT_SECONDS": bad})
    with pytest.raises(AttributeError):
        ClientSettings({}).shard_addr = "elsewhere"  # type: ignore[misc]
