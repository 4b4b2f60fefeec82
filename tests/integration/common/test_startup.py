"""Every service reports a start-up failure the same way: one line naming the cause, exit 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tests.conftest import TokenFactory

SERVICES = ("shard", "governance", "artifacts", "compactor", "embedder")
TEST_EMBEDDER = {"ENGRAM_EMBEDDER_EMBEDDER": "hash", "ENGRAM_EMBEDDER_ALLOW_TEST_EMBEDDER": "true"}
"""The embedding service on the hash embedder: its start-up checks, without loading a model."""


def _start(service: str, home: Path, *, ungated: bool = True,
           **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    environ["ENGRAM_HOME"] = str(home)
    if ungated:
        environ["ENGRAM_SHARD_ALLOW_UNGATED"] = "true"
    environ.update(env)
    return subprocess.run([sys.executable, "-m", f"services.{service}"], env=environ,
                          capture_output=True, text=True, timeout=60, check=False)


def _one_error_line(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [json.loads(line) for line in result.stderr.splitlines()
              if line.startswith("{") and json.loads(line)["level"] == "error"]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.mark.parametrize("service", SERVICES)
def test_a_setting_that_does_not_parse_is_named(service: str, tmp_path: Path,
                                                engram_home: Path) -> None:
    variable = f"ENGRAM_{service.upper()}_PORT"
    error = _one_error_line(_start(service, engram_home, **{variable: "not-a-port"}))
    assert variable in str(error["msg"])


@pytest.mark.parametrize("service", SERVICES)
def test_a_port_taken_is_named(service: str, tmp_path: Path, engram_home: Path,
                               make_token: TokenFactory) -> None:
    token = tmp_path / "service.token"
    token.write_text(make_token("svc-compactor", "system", ("service",)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        error = _one_error_line(_start(service, engram_home, **{
            f"ENGRAM_{service.upper()}_PORT": str(port),
            f"ENGRAM_{service.upper()}_DB_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE": str(token), **TEST_EMBEDDER}))
    assert str(port) in str(error["msg"])


@pytest.fixture(scope="module")
def server_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from cryptography import x509

    from tests.pki import issue, write_pair

    directory = tmp_path_factory.mktemp("pki")
    ca_cert, ca_key = issue("engram-test-ca", x509.Name([]), None, ca=True)  # type: ignore[arg-type]
    cert, key = issue("svc", ca_cert.subject, ca_key, ca=False, server=True)
    ca_path, _ = write_pair(directory, "ca", ca_cert, ca_key)
    cert_path, key_path = write_pair(directory, "server", cert, key)
    return {"TLS_CERT": cert_path, "TLS_KEY": key_path, "TLS_CLIENT_CA": ca_path,
            "WRONG_KEY": directory / "ca.key"}


INCOMPLETE_TLS = {
    "cert without key": (("TLS_CERT",), "TLS_KEY"),
    "key without cert": (("TLS_KEY",), "TLS_CERT"),
    "client CA alone": (("TLS_CLIENT_CA",), "TLS_CLIENT_CA"),
    "client CA and cert without key": (("TLS_CLIENT_CA", "TLS_CERT"), "TLS_KEY"),
}


@pytest.mark.parametrize("case", sorted(INCOMPLETE_TLS))
@pytest.mark.parametrize("service", SERVICES)
def test_incomplete_tls_refuses_to_start(service: str, case: str, tmp_path: Path,
                                         engram_home: Path, make_token: TokenFactory,
                                         server_pair: dict[str, Path]) -> None:
    """Finding 5: a certificate without its key (or a client CA alone) served plaintext."""
    given, named = INCOMPLETE_TLS[case]
    prefix = f"ENGRAM_{service.upper()}_"
    error = _one_error_line(_start(service, engram_home, **_bootable(service, tmp_path, make_token),
                                   **{prefix + part: str(server_pair[part]) for part in given}))
    assert prefix + named in str(error["msg"])


@pytest.mark.parametrize("service", SERVICES)
def test_a_tls_file_missing_is_named(service: str, tmp_path: Path, engram_home: Path,
                                     make_token: TokenFactory,
                                     server_pair: dict[str, Path]) -> None:
    prefix = f"ENGRAM_{service.upper()}_"
    error = _one_error_line(_start(service, engram_home, **_bootable(service, tmp_path, make_token),
                                   **{prefix + "TLS_CERT": str(tmp_path / "gone.pem"),
                                      prefix + "TLS_KEY": str(server_pair["TLS_KEY"])}))
    assert prefix + "TLS_CERT" in str(error["msg"]) and "gone.pem" in str(error["msg"])


def test_a_shard_without_governance_does_not_start_unless_told_it_may(
        tmp_path: Path, engram_home: Path) -> None:
    """README: the shard refuses to start without governance unless
    ENGRAM_SHARD_ALLOW_UNGATED=true (the fail-closed default), and a governance address
    without the service token to call it with is named too."""
    database = {"ENGRAM_SHARD_DB_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
                "ENGRAM_SHARD_EMBEDDER": "none"}
    error = _one_error_line(_start("shard", engram_home, ungated=False, **database))
    assert "ENGRAM_SHARD_GOVERNANCE_ADDR" in str(error["msg"])
    error = _one_error_line(_start("shard", engram_home, ungated=False, **database,
                                   ENGRAM_SHARD_GOVERNANCE_ADDR="127.0.0.1:1"))
    assert "ENGRAM_SHARD_SERVICE_TOKEN_FILE" in str(error["msg"])


@pytest.mark.parametrize("service", SERVICES)
def test_a_key_that_is_not_the_certificates_is_named(service: str, tmp_path: Path,
                                                     engram_home: Path, make_token: TokenFactory,
                                                     server_pair: dict[str, Path]) -> None:
    prefix = f"ENGRAM_{service.upper()}_"
    error = _one_error_line(_start(service, engram_home, **_bootable(service, tmp_path, make_token),
                                   **{prefix + "TLS_CERT": str(server_pair["TLS_CERT"]),
                                      prefix + "TLS_KEY": str(server_pair["WRONG_KEY"])}))
    assert prefix + "TLS_KEY" in str(error["msg"])


def _bootable(service: str, tmp_path: Path, make_token: TokenFactory) -> dict[str, str]:
    """Everything else a service needs to start, so only its TLS settings can stop it."""
    token = tmp_path / "service.token"
    token.write_text(make_token("svc-compactor", "system", ("service",)))
    return {f"ENGRAM_{service.upper()}_DB_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "ENGRAM_SHARD_EMBEDDER": "none", "ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE": str(token),
            **TEST_EMBEDDER}


@pytest.mark.parametrize(("env", "named"), [
    ({"ENGRAM_EMBEDDER_EMBEDDER": "bert-huge"}, "ENGRAM_EMBEDDER_EMBEDDER"),
    ({"ENGRAM_EMBEDDER_EMBEDDER": "hash"}, "ENGRAM_EMBEDDER_ALLOW_TEST_EMBEDDER"),
])
def test_the_embedder_names_a_model_it_cannot_serve(env: dict[str, str], named: str,
                                                     engram_home: Path) -> None:
    error = _one_error_line(_start("embedder", engram_home, **env))
    assert named in str(error["msg"])


def test_a_shard_whose_embedder_never_answers_does_not_start(
        tmp_path: Path, engram_home: Path, make_service_token: Callable[[str], str]) -> None:
    token = tmp_path / "shard.token"
    token.write_text(make_service_token("shard"))
    # Bound and not listening for the whole test: nobody answers, and no other test's server
    # can take the port meanwhile.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        error = _one_error_line(_start("shard", engram_home, **{
            "ENGRAM_SHARD_DB_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "ENGRAM_SHARD_EMBEDDER_ADDR": f"127.0.0.1:{port}",
            "ENGRAM_SHARD_SERVICE_TOKEN_FILE": str(token),
            "ENGRAM_SHARD_EMBEDDER_START_TIMEOUT_SECONDS": "0.5"}))
    assert "ENGRAM_SHARD_EMBEDDER_START_TIMEOUT_SECONDS" in str(error["msg"])


def test_a_model_directory_missing_a_file_stops_the_shard_naming_it(
    tmp_path: Path, engram_home: Path
) -> None:
    from services.shard.retrieval.embedding import default_minilm_dir

    model = tmp_path / "bge"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model / name).symlink_to(default_minilm_dir() / name)
    (model / "1_Pooling").symlink_to(default_minilm_dir() / "1_Pooling")
    error = _one_error_line(_start("shard", engram_home, ENGRAM_SHARD_EMBEDDER=str(model),
                                   ENGRAM_SHARD_DB_URL=f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert "tokenizer.json is missing" in str(error["msg"])


DATABASE_SERVICES = ("shard", "governance", "artifacts", "compactor")


@pytest.mark.parametrize("service", DATABASE_SERVICES)
def test_migrate_false_on_a_database_without_the_schema_is_named(
        service: str, tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    """README: migrations run at start unless ENGRAM_<SVC>_MIGRATE=false. With it false and a
    database that lacks the schema, the service says so in one line naming the setting and
    the revisions (before 2026-11-29: governance's first query failed on `no such table`)."""
    token = tmp_path / "service.token"
    token.write_text(make_token("svc-compactor", "system", ("service",)))
    error = _one_error_line(_start(service, engram_home, **{
        f"ENGRAM_{service.upper()}_MIGRATE": "false",
        f"ENGRAM_{service.upper()}_DB_URL": f"sqlite:///{tmp_path / 'empty.db'}",
        "ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE": str(token)}))
    message = str(error["msg"])
    assert f"ENGRAM_{service.upper()}_MIGRATE=false" in message
    assert "none (empty)" in message and "no such table" not in message


def test_migrate_false_starts_on_a_database_at_the_newest_revision(tmp_path: Path) -> None:
    """The check passes once the schema is there, and an older revision is named."""
    from alembic import command
    from alembic.config import Config

    from services.common.db import Database
    from services.common.startup import StartupError
    from services.shard.server import MIGRATIONS

    database = Database(f"sqlite:///{tmp_path / 'shard.db'}")
    try:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("sqlalchemy.url", database.url)
        with database.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "0001")
        with pytest.raises(StartupError, match="schema revision 0001"):
            database.prepare_schema(MIGRATIONS, "shard", migrate=False)
        database.prepare_schema(MIGRATIONS, "shard", migrate=True)
        database.prepare_schema(MIGRATIONS, "shard", migrate=False)
    finally:
        database.dispose()


@pytest.mark.parametrize("service", DATABASE_SERVICES)
def test_migrate_false_serves_on_a_database_a_start_migrated(
        service: str, tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    """README: migrations run at start unless ENGRAM_<SVC>_MIGRATE=false (then checked). A
    service built on a database its migrating start left behind starts with it false and
    answers (SERVING: its database answers; the shard is ungated, the compactor's shard is
    not needed for health)."""
    import importlib

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from services.common.tokens import write_token_file

    token = tmp_path / "service.token"
    write_token_file(token, make_token("svc-compactor", "system", ("service",)))
    settings_module = importlib.import_module(f"services.{service}.settings")
    settings_class = next(getattr(settings_module, name) for name in dir(settings_module)
                          if name.lower() == f"{service}settings")
    build = getattr(importlib.import_module(f"services.{service}.server"),
                    f"build_{service}_server")
    extras: dict[str, dict[str, object]] = {
        "shard": {"allow_ungated": True, "embedder": "none"},
        "compactor": {"service_token_file": token}}
    extra = extras.get(service, {})
    url = f"sqlite:///{tmp_path / f'{service}.db'}"
    for migrate in (True, False):
        settings = settings_class(home=engram_home, port=0, db_url=url, migrate=migrate,
                                  **extra)
        built = build(settings)
        server = built[0] if isinstance(built, tuple) else built
        server.start()
        try:
            channel = grpc.insecure_channel(server.address)
            check = health_pb2_grpc.HealthStub(channel).Check
            reply = check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, (service, migrate)
            channel.close()
        finally:
            server.stop(0)


@pytest.mark.parametrize("service", DATABASE_SERVICES)
def test_each_services_schema_check_reads_the_version_table_its_migrations_write(
        service: str, tmp_path: Path) -> None:
    import importlib

    from services.common.db import Database

    migrations = importlib.import_module(f"services.{service}.server").MIGRATIONS
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        database.prepare_schema(migrations, service, migrate=True)
        database.prepare_schema(migrations, service, migrate=False)  # no StartupError
    finally:
        database.dispose()
