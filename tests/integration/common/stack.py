"""The four services as real servers on 127.0.0.1:0, wired as `engram up` wires them, and one
cheap authenticated call per service to see whether a token gets through."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.artifacts.v1 import artifacts_service_pb2_grpc as apb_grpc
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.compactor.v1 import compactor_service_pb2_grpc as cpb_grpc
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.governance.v1 import governance_service_pb2_grpc as gpb_grpc
from engram.shard.v1 import shard_service_pb2 as spb
from engram.shard.v1 import shard_service_pb2_grpc as spb_grpc
from services.artifacts.server import build_artifacts_server
from services.artifacts.settings import ArtifactsSettings
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from services.shard.governance_gate import connect_governance
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory

SERVICES = ("shard", "governance", "artifacts", "compactor")
Outcome = tuple[grpc.StatusCode, str]
"""The status code of a call and its ErrorInfo reason ("" when OK or none)."""


def reason_of(error: grpc.RpcError) -> str:
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return ""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


@dataclass
class Stack:
    servers: dict[str, EngramServer]
    channels: dict[str, grpc.Channel]

    def address(self, service: str) -> str:
        return self.servers[service].address

    def stub(self, service: str) -> Any:
        stubs = {"shard": spb_grpc.ShardServiceStub, "governance": gpb_grpc.GovernanceServiceStub,
                 "artifacts": apb_grpc.ArtifactsServiceStub,
                 "compactor": cpb_grpc.CompactorServiceStub}
        return stubs[service](self.channels[service])

    def call(self, service: str, method: str, request: Any, token: str) -> Outcome:
        """One call (a stream is read to its end); its code and reason."""
        rpc = getattr(self.stub(service), method)
        metadata = [("authorization", f"Bearer {token}")]
        try:
            reply = rpc(request, metadata=metadata, timeout=10)
            if hasattr(reply, "__iter__") and not hasattr(reply, "ListFields"):
                list(reply)
        except grpc.RpcError as error:
            return error.code(), reason_of(error)
        return grpc.StatusCode.OK, ""

    def probe(self, service: str, token: str) -> Outcome:
        """A read any agent may make on its own fleet."""
        probes = {
            "shard": ("GetStatus", spb.GetStatusRequest()),
            "governance": ("ListRules", gpb.ListRulesRequest()),
            "artifacts": ("ListRuns", apb.ListRunsRequest()),
            "compactor": ("ListRecentIterations",
                          cpb.ListRecentIterationsRequest(run_id="probe-run")),
        }
        method, request = probes[service]
        code, reason = self.call(service, method, request, token)
        if code == grpc.StatusCode.NOT_FOUND:  # got past auth to the store
            return grpc.StatusCode.OK, ""
        return code, reason


@contextmanager
def running_stack(tmp_path: Path, home: Path, make_token: TokenFactory, *,
                  with_governance: bool = True,
                  settings: Callable[[str], dict[str, Any]] = lambda _s: {}) -> Iterator[Stack]:
    """Governance first, then artifacts, the gated shard, the compactor (as `engram up`)."""
    servers: dict[str, EngramServer] = {}
    tokens = {}
    for service in SERVICES:
        tokens[service] = tmp_path / f"{service}.token"
        write_token_file(tokens[service], make_token(f"svc-{service}", "system", ("service",)))
    try:
        governance = build_governance_server(GovernanceSettings(
            home=home, port=0, db_url=f"sqlite:///{tmp_path / 'governance.db'}",
            **settings("governance")))
        servers["governance"] = governance.start()
        gov: dict[str, Any] = (
            {"governance_addr": governance.address} if with_governance else {})
        artifacts, _ = build_artifacts_server(ArtifactsSettings(
            home=home, port=0, db_url=f"sqlite:///{tmp_path / 'artifacts.db'}",
            blob_url=(tmp_path / "artifact-blobs").as_uri(),
            **({**gov, "service_token_file": tokens["artifacts"]} if gov else {}),
            **settings("artifacts")))
        servers["artifacts"] = artifacts.start()
        gate, trust = connect_governance(governance.address, tokens["shard"], ttl_seconds=0.0)
        shard, _ = build_shard_server(ShardSettings(
            home=home, port=0, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
            **({**gov, "service_token_file": tokens["shard"]} if gov else {}),
            **settings("shard")), gate=gate, trust=trust)
        servers["shard"] = shard.start()
        compactor = build_compactor_server(CompactorSettings(
            home=home, port=0, db_url=f"sqlite:///{tmp_path / 'compactor.db'}",
            blob_url=(tmp_path / "compactor-blobs").as_uri(), shard_addr=shard.address,
            service_token_file=tokens["compactor"], **gov, **settings("compactor")))
        servers["compactor"] = compactor.start()
        channels = {name: grpc.insecure_channel(server.address)
                    for name, server in servers.items()}
        try:
            yield Stack(servers, channels)
        finally:
            for channel in channels.values():
                channel.close()
    finally:
        for name in reversed(list(servers)):
            servers[name].stop(0)
