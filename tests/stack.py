"""Governance, a shard it gates and artifacts as real servers on 127.0.0.1:0, in this process:
the stack the client-side integration tests (MCP, gateway) put their front ends on."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class GatedStack:
    governance: EngramServer
    shard: EngramServer
    artifacts: EngramServer


@contextmanager
def gated_stack(data: Path, home: Path, make_token: TokenFactory,
                db_urls: Mapping[str, str] | None = None, *,
                governed: bool = False,
                shard: Mapping[str, Any] | None = None,
                artifacts: Mapping[str, Any] | None = None) -> Iterator[GatedStack]:
    """The three servers, each with its SQLite store under ``data`` (or the database
    ``db_urls[service]`` names); stopped on exit. ``governed``: artifacts reads access
    restrictions and erasures from governance too, with its own service token.
    ``shard``, ``artifacts``: more of their settings (an embedder, an S3 ``blob_url``)."""
    urls = {name: f"sqlite:///{data / f'{name}.db'}"
            for name in ("governance", "shard", "artifacts")} | dict(db_urls or {})
    governance = build_governance_server(GovernanceSettings(
        home=home, port=0, db_url=urls["governance"]))
    governance.start()
    token_file = data / "shard-service.token"
    write_token_file(token_file, make_token("svc-shard", "system", ("service",)))
    gate, trust = connect_governance(governance.address, token_file, gate_timeout=5.0,
                                     ttl_seconds=0.0)
    # The index snapshot beside this stack's store: under the shared home, the next stack's
    # shard found this one's, refused it (another store) and logged a rebuild.
    shard_server, _ = build_shard_server(ShardSettings(**{
        "home": home, "port": 0, "db_url": urls["shard"], "embedder": "none",
        "index_snapshot_path": data / "shard-index.snapshot"} | dict(shard or {})),
        gate=gate, trust=trust)
    shard_server.start()
    artifacts_token = data / "artifacts-service.token"
    write_token_file(artifacts_token, make_token("svc-artifacts", "system", ("service",)))
    artifacts_server, _ = build_artifacts_server(ArtifactsSettings(**{
        "home": home, "port": 0, "db_url": urls["artifacts"],
        "blob_url": (data / "blobs").as_uri(),
        "governance_addr": governance.address if governed else None,
        "service_token_file": artifacts_token if governed else None} | dict(artifacts or {})))
    artifacts_server.start()
    try:
        yield GatedStack(governance, shard_server, artifacts_server)
    finally:
        artifacts_server.stop(0)
        shard_server.stop(0)
        governance.stop(0)


@dataclass(frozen=True)
class FullStack:
    governance: EngramServer
    shard: EngramServer
    artifacts: EngramServer
    compactor: EngramServer

    def addresses(self) -> dict[str, str]:
        return {name: getattr(self, name).address
                for name in ("shard", "governance", "artifacts", "compactor")}


@contextmanager
def full_stack(data: Path, home: Path, make_token: TokenFactory,
               db_urls: Mapping[str, str] | None = None, *,
               governed: bool = False,
               shard: Mapping[str, Any] | None = None,
               artifacts: Mapping[str, Any] | None = None,
               compactor: Mapping[str, Any] | None = None) -> Iterator[FullStack]:
    """:func:`gated_stack` and a compactor beside it (its store too from ``db_urls``;
    ``shard``, ``artifacts``, ``compactor``: more of their settings, e.g. an embedder, small
    tiers or S3 blobs)."""
    with gated_stack(data, home, make_token, db_urls, governed=governed, shard=shard,
                     artifacts=artifacts) as servers:
        token_file = data / "compactor-service.token"
        write_token_file(token_file, make_token("svc-compactor", "system", ("service",)))
        compactor_server = build_compactor_server(CompactorSettings(**{
            "home": home, "port": 0,
            "db_url": (db_urls or {}).get("compactor", f"sqlite:///{data / 'compactor.db'}"),
            "blob_url": (data / "cold").resolve().as_uri(),
            "shard_addr": servers.shard.address, "service_token_file": token_file,
            "governance_addr": servers.governance.address if governed else None,
        } | dict(compactor or {}))).start()
        try:
            yield FullStack(servers.governance, servers.shard, servers.artifacts,
                            compactor_server)
        finally:
            compactor_server.stop(0)
