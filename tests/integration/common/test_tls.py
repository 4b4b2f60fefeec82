"""TLS and mutual TLS on the shared server wiring, with certificates made for the test."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from engram.client import EngramRpcError, ShardClient, open_channel
from services.common.server import EngramServer
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


def _write_pair(directory: Path, name: str, cert: x509.Certificate,
                key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _issue(name: str, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey, *, ca: bool,
           server: bool = False) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer if not ca else subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=1))
               .not_valid_after(now + dt.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(key if ca else signer, hashes.SHA256()), key


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca_cert, ca_key = _issue("engram-test-ca", x509.Name([]), None, ca=True)  # type: ignore[arg-type]
    server_cert, server_key = _issue("shard", ca_cert.subject, ca_key, ca=False, server=True)
    client_cert, client_key = _issue("agent", ca_cert.subject, ca_key, ca=False)
    ca_path, _ = _write_pair(tmp_path, "ca", ca_cert, ca_key)
    server_crt, server_key_path = _write_pair(tmp_path, "server", server_cert, server_key)
    client_crt, client_key_path = _write_pair(tmp_path, "client", client_cert, client_key)
    return {"ca": ca_path, "server_cert": server_crt, "server_key": server_key_path,
            "client_cert": client_crt, "client_key": client_key_path}


@pytest.fixture
def mtls_shard(tmp_path: Path, engram_home: Path,
               pki: dict[str, Path]) -> Iterator[EngramServer]:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 't.db'}", port=0,
                             allow_ungated=True, embedder="none", tls_cert=pki["server_cert"],
                             tls_key=pki["server_key"], tls_client_ca=pki["ca"])
    server, _service = build_shard_server(settings)
    server.start()
    yield server
    server.stop(0)


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
