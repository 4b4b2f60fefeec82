"""TLS and mutual TLS on the shared server wiring, with certificates made for the test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner

import engram.cli._output as output
from engram.cli.main import app
from engram.client import EngramRpcError, ShardClient, TlsFiles, open_channel
from services.common.errors import Unavailable
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.compactor.settings import CompactorSettings
from services.compactor.shard_gateway import ShardCompactionGateway
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from services.shard.governance_gate import connect_governance
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory
from tests.pki import issue, write_pair


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca_cert, ca_key = issue("engram-test-ca", x509.Name([]), None, ca=True)  # type: ignore[arg-type]
    server_cert, server_key = issue("shard", ca_cert.subject, ca_key, ca=False, server=True)
    client_cert, client_key = issue("agent", ca_cert.subject, ca_key, ca=False)
    ca_path, _ = write_pair(tmp_path, "ca", ca_cert, ca_key)
    server_crt, server_key_path = write_pair(tmp_path, "server", server_cert, server_key)
    client_crt, client_key_path = write_pair(tmp_path, "client", client_cert, client_key)
    return {"ca": ca_path, "server_cert": server_crt, "server_key": server_key_path,
            "client_cert": client_crt, "client_key": client_key_path}


@pytest.fixture
def mtls_shard(tmp_path: Path, engram_home: Path,
               pki: dict[str, Path]) -> Iterator[EngramServer]:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 't.db'}", port=0,
                             allow_ungated=True, embedder="none", tls_cert=pki["server_cert"],
                             tls_key=pki["server_key"], tls_client_ca=pki["ca"], health_port=0)
    server, _service = build_shard_server(settings)
    server.start()
    yield server
    server.stop(0)


def _health(port: int, service: str = "") -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10)
    return int(reply.status)


def test_mutual_tls_accepts_a_client_certificate_and_refuses_none(
        mtls_shard: EngramServer, pki: dict[str, Path], make_token: TokenFactory) -> None:
    target = f"localhost:{mtls_shard.port}"
    channel = open_channel(target, pki["ca"], tls_cert=pki["client_cert"],
                           tls_key=pki["client_key"])
    with ShardClient(target, make_token(), channel=channel) as client:
        assert client.add("task: talk over mutual TLS").created

    anonymous = open_channel(target, pki["ca"])
    with (ShardClient(target, make_token(), channel=anonymous) as client,
          pytest.raises(EngramRpcError) as caught):
        client.status()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE

    with (ShardClient(target, make_token(), channel=open_channel(target)) as plain,
          pytest.raises(EngramRpcError)):
        plain.status()


def test_the_health_port_answers_plaintext_probes_and_serves_nothing_else(
        mtls_shard: EngramServer, make_token: TokenFactory) -> None:
    port = mtls_shard.health_port
    assert port is not None and port != mtls_shard.port
    assert _health(port) == health_pb2.HealthCheckResponse.SERVING
    assert _health(port, "engram.shard.v1.ShardService") == health_pb2.HealthCheckResponse.SERVING
    target = f"127.0.0.1:{port}"
    with (ShardClient(target, make_token(), channel=open_channel(target)) as plain,
          pytest.raises(EngramRpcError) as caught):
        plain.status()
    assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_the_health_port_says_not_serving_while_the_server_drains(
        tmp_path: Path, engram_home: Path) -> None:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'd.db'}", port=0,
                             allow_ungated=True, embedder="none", health_port=0,
                             drain_delay_seconds=5.0)  # the window the probe must hit
    server, _service = build_shard_server(settings)
    server.start()
    assert server.health_port is not None
    assert _health(server.health_port) == health_pb2.HealthCheckResponse.SERVING
    stopping = threading.Thread(target=server.stop)
    stopping.start()
    deadline = time.monotonic() + 10  # a bound on waiting, not a speed assertion
    while _health(server.health_port) == health_pb2.HealthCheckResponse.SERVING:
        assert time.monotonic() < deadline, "health never turned NOT_SERVING"
        time.sleep(0.05)
    assert stopping.is_alive(), "the probe must see NOT_SERVING before the server is gone"
    stopping.join(timeout=30)
    with pytest.raises(grpc.RpcError):
        _health(server.health_port)


@pytest.fixture
def tls_cli(monkeypatch: pytest.MonkeyPatch, mtls_shard: EngramServer,
            make_token: TokenFactory) -> Iterator[CliRunner]:
    """The `engram` CLI aimed at the mutual-TLS shard; each test sets the TLS variables."""
    monkeypatch.setenv("ENGRAM_SHARD_ADDR", f"localhost:{mtls_shard.port}")
    monkeypatch.setenv("ENGRAM_TOKEN", make_token())
    monkeypatch.setattr(output, "_settings", None)
    yield CliRunner()
    output._settings = None


def test_cli_presents_the_client_certificate_its_environment_names(
        tls_cli: CliRunner, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_TLS_CA", str(pki["ca"]))
    monkeypatch.setenv("ENGRAM_TLS_CERT", str(pki["client_cert"]))
    monkeypatch.setenv("ENGRAM_TLS_KEY", str(pki["client_key"]))
    added = tls_cli.invoke(app, ["add", "task: the CLI over mutual TLS", "--json"])
    assert added.exit_code == 0, added.output
    found = tls_cli.invoke(app, ["query", "mutual TLS", "--json"])
    assert found.exit_code == 0, found.output
    assert "the CLI over mutual TLS" in found.stdout


def test_cli_without_a_client_certificate_is_refused_by_a_mutual_tls_shard(
        tls_cli: CliRunner, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_TLS_CA", str(pki["ca"]))
    result = tls_cli.invoke(app, ["status"])
    assert result.exit_code == 2
    assert "UNAVAILABLE" in result.output


@pytest.mark.parametrize(("variables", "says"), [
    ({"ENGRAM_TLS_CA": "ca", "ENGRAM_TLS_CERT": "client_cert"}, "needs its private key"),
    ({"ENGRAM_TLS_CERT": "client_cert", "ENGRAM_TLS_KEY": "client_key"}, "ENGRAM_TLS_CA"),
    ({"ENGRAM_TLS_CA": "missing"}, "No such file"),
])
def test_cli_names_tls_settings_that_cannot_work(
        tls_cli: CliRunner, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, variables: dict[str, str], says: str) -> None:
    for name, key in variables.items():
        monkeypatch.setenv(name, str(pki.get(key, tmp_path / key)))
    result = tls_cli.invoke(app, ["status"])
    assert result.exit_code == 1
    assert says in result.output
    assert "Traceback" not in result.output


def test_shard_reaches_a_mutual_tls_governance_with_its_client_certificate(
        tmp_path: Path, engram_home: Path, pki: dict[str, Path],
        make_token: TokenFactory) -> None:
    governance = build_governance_server(GovernanceSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'gov.db'}",
        tls_cert=pki["server_cert"], tls_key=pki["server_key"], tls_client_ca=pki["ca"]))
    governance.start()
    token_file = tmp_path / "shard-service.token"
    write_token_file(token_file, make_token("svc-shard", "system", ("service",)))
    target = f"localhost:{governance.port}"
    shard_settings = ShardSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'shard.db'}", embedder="none",
        governance_tls_ca=pki["ca"], governance_tls_cert=pki["client_cert"],
        governance_tls_key=pki["client_key"])
    without_cert = TlsFiles(tls_ca=pki["ca"])
    try:
        for tls, admitted in ((shard_settings.governance_tls(), True), (without_cert, False)):
            gate, trust = connect_governance(target, token_file, gate_timeout=2.0, tls=tls)
            shard, _service = build_shard_server(shard_settings, gate=gate, trust=trust)
            shard.start()
            try:
                with ShardClient(shard.address, make_token("honest", "fleet-a")) as client:
                    if admitted:
                        assert client.add("gated over mutual TLS", domain="technical").created
                    else:  # governance refuses the connection: the gate fails closed
                        with pytest.raises(EngramRpcError) as refused:
                            client.add("no certificate, no write", domain="technical")
                        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            finally:
                shard.stop(0)
    finally:
        governance.stop(0)


def test_compactor_reaches_a_mutual_tls_shard_with_its_client_certificate(
        mtls_shard: EngramServer, pki: dict[str, Path], make_token: TokenFactory) -> None:
    token = make_token("svc-compactor", "system", ("service",))
    target = f"localhost:{mtls_shard.port}"
    settings = CompactorSettings(shard_addr=target, shard_tls_ca=pki["ca"],
                                 shard_tls_cert=pki["client_cert"],
                                 shard_tls_key=pki["client_key"])
    gateway = ShardCompactionGateway(target, token, 10.0, settings.shard_tls())
    assert gateway.compact("fleet-a", 0.3, 30.0, dry_run=True).groups == ()
    without = ShardCompactionGateway(target, token, 10.0,
                                     TlsFiles(tls_ca=pki["ca"]))
    with pytest.raises(Unavailable):
        without.compact("fleet-a", 0.3, 30.0, dry_run=True)
