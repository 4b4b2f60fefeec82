"""Least privilege: every method of every service, called by every kind of principal.

The five real servers run on loopback; each method is called with an empty request by an
agent, a governor, an admin and each service's own principal. A kind the method's access
table admits gets past authorization (the call may still fail validation); any other kind
is refused PERMISSION_DENIED by the table. The tables themselves grant each service only
what its role needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from engram.artifacts.v1 import artifacts_service_pb2 as artifacts_pb
from engram.client import CompactorClient, EngramRpcError, ShardClient
from engram.compactor.v1 import compactor_service_pb2 as compactor_pb
from engram.embedder.v1 import embedder_service_pb2 as embedder_pb
from engram.governance.v1 import governance_service_pb2 as governance_pb
from engram.shard.v1 import shard_service_pb2 as shard_pb
from services.artifacts.server import build_artifacts_server
from services.artifacts.servicer import POLICY as ARTIFACTS_POLICY
from services.artifacts.settings import ArtifactsSettings
from services.common.auth import (
    COMPACTOR_SERVICE,
    SERVICE_NAMES,
    SHARD_SERVICE,
    MethodPolicy,
    caller_kinds,
    service_principal,
)
from services.common.server import EngramServer
from services.common.tokens import Principal, write_token_file
from services.compactor.server import build_compactor_server
from services.compactor.servicer import POLICY as COMPACTOR_POLICY
from services.compactor.settings import CompactorSettings
from services.embedder.server import build_embedder_server
from services.embedder.servicer import POLICY as EMBEDDER_POLICY
from services.embedder.settings import EmbedderSettings
from services.governance.server import build_governance_server
from services.governance.servicer import POLICY as GOVERNANCE_POLICY
from services.governance.settings import GovernanceSettings
from services.shard.server import build_shard_server
from services.shard.servicer import POLICY as SHARD_POLICY
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


@dataclass(frozen=True)
class Service:
    name: str
    descriptor: ServiceDescriptor
    policy: MethodPolicy


SERVICES = (
    Service("shard", shard_pb.DESCRIPTOR.services_by_name["ShardService"], SHARD_POLICY),
    Service("governance", governance_pb.DESCRIPTOR.services_by_name["GovernanceService"],
            GOVERNANCE_POLICY),
    Service("artifacts", artifacts_pb.DESCRIPTOR.services_by_name["ArtifactsService"],
            ARTIFACTS_POLICY),
    Service("compactor", compactor_pb.DESCRIPTOR.services_by_name["CompactorService"],
            COMPACTOR_POLICY),
    Service("embedder", embedder_pb.DESCRIPTOR.services_by_name["EmbedderService"],
            EMBEDDER_POLICY),
)

PRINCIPALS: dict[str, Principal] = {
    "agent": Principal("agent-1", "fleet-a", frozenset({"agent"})),
    "governor": Principal("gov-1", "fleet-a", frozenset({"governor"})),
    "admin": Principal("ops", "fleet-a", frozenset({"admin"})),
    **{f"service:{name}": Principal(*service_principal(name)) for name in SERVICE_NAMES},
}

GENERIC_SERVICE_METHODS = {"ListAccessRestrictions"}
"""Methods any service principal may call (a feed every service reads), where they exist."""

SERVICE_GRANTS = {
    "service:shard": {"GovernanceService/DecideWrites", "GovernanceService/DecideWriteBatches",
                      "GovernanceService/BatchGetTrust", "GovernanceService/GetErasure",
                      "EmbedderService/Embed", "EmbedderService/Describe"},
    "service:compactor": {"ShardService/CompactRecords", "ShardService/ApplyRetention",
                          "GovernanceService/GetErasure"},
    "service:artifacts": {"GovernanceService/GetErasure"},  # each erases what governance lists
    "service:governance": set(),
}


def _granted(kind: str) -> set[str]:
    """``Service/Method`` names a caller of ``kind`` may call according to the tables."""
    kinds = caller_kinds(PRINCIPALS[kind])
    return {method.split(".")[-1] for service in SERVICES for method, allowed in
            service.policy.items() if kinds & allowed}


@pytest.mark.parametrize("kind", sorted(SERVICE_GRANTS))
def test_each_service_identity_is_granted_only_what_its_role_needs(kind: str) -> None:
    generic = {name for name in _granted(kind) if name.split("/")[-1] in GENERIC_SERVICE_METHODS}
    assert _granted(kind) - generic == SERVICE_GRANTS[kind]


def test_a_service_token_of_another_fleet_is_no_service_identity() -> None:
    """Found by a review (2026-11-29): svc-shard with role service in fleet-a (a token
    `engram token create --role service --fleet fleet-a` mints) decided writes and read the
    trust of any fleet, as the shard does."""
    assert caller_kinds(Principal("svc-shard", "fleet-a", frozenset({"service"}))) == \
        {"service"}
    assert "service:shard" in caller_kinds(Principal("svc-shard", "system",
                                                     frozenset({"service"})))


def test_an_unknown_service_principal_is_granted_only_the_generic_methods() -> None:
    stranger = Principal("svc-x", "system", frozenset({"service"}))
    assert caller_kinds(stranger) == {"service"}
    for service in SERVICES:
        for method, allowed in service.policy.items():
            if caller_kinds(stranger) & allowed:
                assert method.rsplit("/", 1)[1] in GENERIC_SERVICE_METHODS


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, engram_home: Path,
          make_service_token: Any) -> Iterator[dict[str, EngramServer]]:
    root = tmp_path_factory.mktemp("stack")
    governance = build_governance_server(GovernanceSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{root / 'governance.db'}")).start()
    shard, _ = build_shard_server(ShardSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{root / 'shard.db'}", allow_ungated=True,
        embedder="none"))
    shard.start()
    artifacts, _ = build_artifacts_server(ArtifactsSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{root / 'artifacts.db'}",
        blob_url=(root / "blobs").resolve().as_uri()))
    artifacts.start()
    token_file = root / "compactor.token"
    write_token_file(token_file, make_service_token("compactor"))
    compactor = build_compactor_server(CompactorSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{root / 'compactor.db'}",
        blob_url=(root / "compactor-blobs").resolve().as_uri(), shard_addr=shard.address,
        service_token_file=token_file)).start()
    embedder = build_embedder_server(EmbedderSettings(
        home=engram_home, port=0, embedder="hash", allow_test_embedder=True)).start()
    servers = {"shard": shard, "governance": governance, "artifacts": artifacts,
               "compactor": compactor, "embedder": embedder}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop(0)


def _tokens(make_token: TokenFactory) -> Mapping[str, str]:
    return {kind: make_token(p.agent_id, p.fleet_id, tuple(p.roles))
            for kind, p in PRINCIPALS.items()}


def _call(channel: grpc.Channel, path: str, request: Any, streaming: bool,
          token: str) -> grpc.RpcError | None:
    metadata = (("authorization", f"Bearer {token}"),)
    try:
        if streaming:
            list(channel.unary_stream(path, request_serializer=type(request).SerializeToString,
                                      response_deserializer=bytes)(request, metadata=metadata,
                                                                   timeout=30))
        else:
            channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                response_deserializer=bytes)(request, metadata=metadata,
                                                             timeout=30)
    except grpc.RpcError as error:
        return error
    return None


def _reason(error: grpc.RpcError | None) -> str:
    status = rpc_status.from_call(error) if isinstance(error, grpc.Call) else None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.name)
def test_every_method_refuses_every_kind_its_table_does_not_name(
        service: Service, stack: dict[str, EngramServer], make_token: TokenFactory) -> None:
    tokens = _tokens(make_token)
    with grpc.insecure_channel(stack[service.name].address) as channel:
        for method in service.descriptor.methods:
            path = f"/{service.descriptor.full_name}/{method.name}"
            request = message_factory.GetMessageClass(method.input_type)()
            for kind, principal in PRINCIPALS.items():
                error = _call(channel, path, request, method.server_streaming, tokens[kind])
                code = error.code() if isinstance(error, grpc.Call) else None
                table_refused = (code == grpc.StatusCode.PERMISSION_DENIED
                                 and _reason(error) == "ROLE_REQUIRED")
                where = f"{path} as {kind}"
                assert code != grpc.StatusCode.UNAUTHENTICATED, where
                if caller_kinds(principal) & service.policy[path]:
                    assert not table_refused, f"{where}: refused by the table that admits it"
                else:
                    assert table_refused, f"{where}: not refused by the table ({code})"


def test_the_artifacts_token_cannot_compact_or_retire_another_fleets_memory(
        stack: dict[str, EngramServer], make_token: TokenFactory,
        make_service_token: Any) -> None:
    """Finding 6 replayed: the artifacts service's token ran shard CompactRecords and
    ApplyRetention (deleting fleet-b's records) and the compactor's memory-policy calls."""
    owner = ShardClient(stack["shard"].address, make_token("agent-b", "fleet-b", ("agent",)))
    stolen = make_service_token("artifacts")
    shard = ShardClient(stack["shard"].address, stolen)
    compactor = CompactorClient(stack["compactor"].address, stolen)
    with owner, shard, compactor:
        kept = owner.add("fleet b's memory that nobody else may delete", importance=0.1).record
        attempts = [
            lambda: shard.compact("fleet-b", importance_below=1.0, older_than_days=0,
                                  dry_run=False),
            lambda: shard.apply_retention("fleet-b", 0, False),
            lambda: compactor.compact_memory("fleet-b", older_than_days=0),
            lambda: compactor.apply_retention("fleet-b", older_than_days=0),
            lambda: list(compactor.policy_runs("fleet-b")),
        ]
        for attempt in attempts:
            with pytest.raises(EngramRpcError) as refused:
                attempt()
            assert (refused.value.code, refused.value.reason) == (
                grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")
        assert owner.get(kept.id).content == kept.content
    assert SHARD_SERVICE not in caller_kinds(Principal(*service_principal("artifacts")))
    assert COMPACTOR_SERVICE in caller_kinds(Principal(*service_principal("compactor")))


def test_the_compactor_token_compacts_the_fleet_it_names(
        stack: dict[str, EngramServer], make_service_token: Any) -> None:
    with ShardClient(stack["shard"].address, make_service_token("compactor")) as compactor:
        reply = compactor.compact("fleet-b", importance_below=0.2, older_than_days=0,
                                  dry_run=True)
    assert reply.examined >= 0
