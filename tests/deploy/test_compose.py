"""docker-compose.yml: the `engram up` topology on Postgres + S3, checked with no Docker engine."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from concurrent import futures
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.deploy.conftest import (
    BOTO_ENV,
    EMBEDDER,
    EMBEDDER_EDGES,
    GRPC_PORTS,
    ROOT,
    SERVICE_EDGES,
    SERVICES,
    accepted_env,
    parse_settings,
)

Compose = dict[str, Any]


def _service(compose: Compose, name: str) -> dict[str, Any]:
    return dict(compose["services"][name])


def _env(compose: Compose, name: str) -> dict[str, str]:
    env = _service(compose, name)["environment"]
    assert isinstance(env, dict), f"{name}: environment as a mapping"
    # ${VAR:-default} is what compose substitutes when VAR is unset.
    return {k: re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items()}


def _sql_roles() -> dict[str, tuple[str, str]]:
    """role -> (password, database it owns), from the Postgres init script."""
    sql = (ROOT / "deploy" / "compose" / "init-db.sql").read_text()
    roles = dict(re.findall(r"CREATE ROLE (\w+) LOGIN PASSWORD '([^']+)';", sql))
    owners = {owner: db for db, owner in re.findall(r"CREATE DATABASE (\w+) OWNER (\w+);", sql)}
    revoked = set(re.findall(r"REVOKE ALL ON DATABASE (\w+) FROM PUBLIC;", sql))
    assert set(owners.values()) == revoked, "every database closes CONNECT to other roles"
    return {role: (password, owners[role]) for role, password in roles.items()}


FRONT_SERVICE = "shard-front"
"""The front proxy before the shard (profile "front"; docs/reliability.md)."""
ALL = (*SERVICES, EMBEDDER)
"""The four and the optional embedding service (profile "embedder")."""
EMBEDDER_PROFILE_ENV = {"ENGRAM_SHARD_EMBEDDER_ADDR": "embedder:50055"}
"""What docs/embedder.md and the file's header have the operator set with the profile."""


def test_topology_is_four_services_postgres_s3_and_init(compose: Compose) -> None:
    assert set(compose["services"]) == {*ALL, FRONT_SERVICE, "postgres", "s3", "engram-init"}
    images = {_service(compose, s)["image"] for s in (*ALL, "engram-init")}
    assert len(images) == 1, "one image for every Engram container"
    for service in ALL:
        assert _service(compose, service)["command"] == ["python", "-m", f"services.{service}"]
    profiles = {name: spec.get("profiles") for name, spec in compose["services"].items()}
    assert profiles.pop(EMBEDDER) == [EMBEDDER], "the embedder runs only with its profile"
    assert profiles.pop(FRONT_SERVICE) == ["front"], "the front proxy runs only with its profile"
    assert set(profiles.values()) == {None}, "everything else runs by default"
    init_sql = "./deploy/compose/init-db.sql:/docker-entrypoint-initdb.d/10-engram.sql:ro"
    assert init_sql in _service(compose, "postgres")["volumes"]


def test_service_containers_are_non_root_read_only_and_capability_free(
        compose: Compose) -> None:
    for service in ALL:
        spec = _service(compose, service)
        uid, _, gid = str(spec["user"]).partition(":")
        assert int(uid) != 0 and int(gid) != 0, service
        assert spec["read_only"] is True, service
        assert "/tmp" in spec["tmpfs"], service
        assert spec["cap_drop"] == ["ALL"] and "cap_add" not in spec, service
        assert "no-new-privileges:true" in spec["security_opt"], service
    init = _service(compose, "engram-init")
    assert init["cap_drop"] == ["ALL"] and set(init["cap_add"]) <= {"CHOWN", "DAC_OVERRIDE",
                                                                   "FOWNER"}
    assert init["read_only"] is True and init["restart"] == "no"


def test_env_names_are_real_settings_and_parse(compose: Compose,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for service in ALL:
        env = _env(compose, service)
        engram = {k for k in env if k.startswith("ENGRAM_")}
        assert engram <= accepted_env(service), (
            f"{service}: {sorted(engram - accepted_env(service))} are not settings it reads")
        assert set(env) - engram <= (BOTO_ENV if service == "compactor" else set()), service
        settings = parse_settings(service, env, monkeypatch)
        assert settings.host == "0.0.0.0", service
        assert settings.port == GRPC_PORTS[service]
        ports = _service(compose, service)["ports"]
        # The embedder's callers are the shards alone: its gRPC port stays unpublished.
        assert (f"127.0.0.1:{settings.port}:{settings.port}" in ports) == (service != EMBEDDER)
        assert f"127.0.0.1:{settings.metrics_port}:{settings.metrics_port}" in ports


def test_each_service_has_its_own_database_and_role(compose: Compose) -> None:
    roles = _sql_roles()
    seen: set[str] = set()
    for service in SERVICES:
        url = urlparse(_env(compose, service)[f"ENGRAM_{service.upper()}_DB_URL"])
        assert url.scheme == "postgresql+psycopg" and url.hostname == "postgres"
        database = url.path.lstrip("/")
        assert url.username == f"engram_{service}" and database == f"engram_{service}"
        assert roles[url.username] == (url.password, database), f"{service}: init-db.sql differs"
        seen.add(database)
    assert len(seen) == len(SERVICES)


def test_shard_has_no_governance_database(compose: Compose) -> None:
    env = _env(compose, "shard")
    assert not any(k.startswith("ENGRAM_GOVERNANCE_") or "GOVERNANCE_DB" in k for k in env)
    assert not any("engram_governance" in v for v in env.values())
    assert env["ENGRAM_SHARD_GOVERNANCE_ADDR"] == "governance:50052"
    mounts = [str(v).split(":")[0] for v in _service(compose, "shard")["volumes"]]
    assert mounts == ["auth-shard"]


def _interpolated(value: str, env: dict[str, str]) -> str:
    """``${VAR:-default}`` as compose substitutes it with ``env`` set."""
    return re.sub(r"\$\{([A-Z0-9_]+):-([^}]*)\}", lambda m: env.get(m[1], m[2]), value)


def _shard_embedder_addr(compose: Compose, env: dict[str, str]) -> str:
    return _interpolated(str(_service(compose, "shard")["environment"].get(
        "ENGRAM_SHARD_EMBEDDER_ADDR", "")), env)


def _points_at_the_embedder(compose: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the profile's variable set, the shard calls the embedder service on its port."""
    addr = _shard_embedder_addr(compose, EMBEDDER_PROFILE_ENV)
    host, _, port = addr.rpartition(":")
    assert host == EMBEDDER, f"the shard calls {addr!r}, not the embedder service"
    embedder = parse_settings(EMBEDDER, _env(compose, EMBEDDER), monkeypatch)
    assert int(port) == embedder.port
    depends = _service(compose, "shard")["depends_on"][EMBEDDER]
    assert depends == {"condition": "service_healthy", "required": False}


def test_the_shard_uses_the_embedder_when_its_profile_runs(
        compose: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    _points_at_the_embedder(compose, monkeypatch)
    assert _shard_embedder_addr(compose, {}) == "", "without it, the shard's own encoder"
    for wrong in ("", "governance:50055", "embedder:50051"):
        changed = yaml.safe_load(yaml.safe_dump(compose))
        changed["services"]["shard"]["environment"]["ENGRAM_SHARD_EMBEDDER_ADDR"] = wrong
        with pytest.raises(AssertionError):
            _points_at_the_embedder(changed, monkeypatch)


def test_the_documented_profile_command_sets_that_address() -> None:
    command = f"ENGRAM_SHARD_EMBEDDER_ADDR={EMBEDDER_PROFILE_ENV['ENGRAM_SHARD_EMBEDDER_ADDR']}"
    for document in ("docker-compose.yml", "docs/embedder.md"):
        text = (ROOT / document).read_text()
        assert f"{command} docker compose --profile embedder up" in text, document


def test_the_embedder_polls_governance_with_its_own_token(
        compose: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = parse_settings(EMBEDDER, _env(compose, EMBEDDER), monkeypatch)
    assert settings.governance_addr == "governance:50052"
    assert str(settings.service_token_file) == "/run/engram/auth/embedder.token"


def _networks(compose: Compose) -> dict[str, set[str]]:
    return {name: set(spec.get("networks", [])) for name, spec in compose["services"].items()}


def test_networks_connect_only_caller_and_callee(compose: Compose) -> None:
    networks = _networks(compose)
    shared = {frozenset(pair) for pair in itertools.combinations(ALL, 2)
              if networks[pair[0]] & networks[pair[1]]}
    assert shared == {frozenset(edge) for edge in SERVICE_EDGES | EMBEDDER_EDGES}
    for network in networks["postgres"]:
        members = {s for s, nets in networks.items() if network in nets} - {"postgres"}
        assert len(members) == 1 and members <= set(SERVICES), f"{network}: {members}"
    s3_users = {s for s in ALL if networks[s] & networks["s3"]}
    assert s3_users == {"artifacts", "compactor"}


def test_credentials_reach_only_the_service_they_belong_to(compose: Compose) -> None:
    for service in ALL:
        spec = _service(compose, service)
        assert spec["volumes"] == [f"auth-{service}:/run/engram/auth:ro"], service
        env = _env(compose, service)
        files = {k: v for k, v in env.items()
                 if k.endswith("_FILE") or k == "ENGRAM_AUTH_PUBLIC_KEY"}
        for value in files.values():
            assert PurePosixPath(value).parent == PurePosixPath("/run/engram/auth"), service
    init = _service(compose, "engram-init")
    assert f"signing:{_env(compose, 'engram-init')['ENGRAM_SIGNING_HOME']}" in init["volumes"]
    for service in ALL:
        assert f"auth-{service}:/run/engram/{service}" in init["volumes"]


def test_start_order_waits_for_credentials_databases_and_callees(compose: Compose) -> None:
    for service in ALL:
        depends = _service(compose, service)["depends_on"]
        if service != EMBEDDER:  # it has no database
            assert depends["postgres"]["condition"] == "service_healthy", service
        assert depends["engram-init"]["condition"] == "service_completed_successfully", service
    for caller, callee in SERVICE_EDGES | EMBEDDER_EDGES:
        assert _service(compose, caller)["depends_on"][callee]["condition"] == "service_healthy"


@pytest.fixture
def health_server() -> Any:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(None)


def test_healthcheck_command_reports_grpc_health(compose: Compose, health_server: Any) -> None:
    servicer, port = health_server
    test = _service(compose, "shard")["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and test[4] == "50051"
    command = [sys.executable, "-c", test[3], str(port)]
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert subprocess.run(command, capture_output=True, timeout=60).returncode == 1
    for service in ALL:
        check = _service(compose, service)["healthcheck"]["test"]
        assert check[3] == test[3] and check[4] == str(GRPC_PORTS[service]), service


def test_the_front_profile_runs_the_generated_proxy_before_the_shard(
        compose: Compose, tmp_path: Any) -> None:
    """Profile "front": nginx from `engram front-config` before the shard, hardened as the
    services are, the same image as deploy/components/front, on a network it shares with
    the shard alone, its configuration the generator's (the command in the file's comment
    writes exactly the committed file) and accepted by nginx."""
    from typer.testing import CliRunner

    from engram.cli.main import app
    from engram.front import FrontLimits, render
    from tests.front import NGINX, nginx_check

    spec = _service(compose, FRONT_SERVICE)
    uid, _, gid = str(spec["user"]).partition(":")
    assert int(uid) != 0 and int(gid) != 0
    assert spec["read_only"] is True and "/tmp" in spec["tmpfs"]
    assert spec["cap_drop"] == ["ALL"] and "cap_add" not in spec
    assert "no-new-privileges:true" in spec["security_opt"]
    component = (ROOT / "deploy" / "components" / "front" / "kustomization.yaml").read_text()
    assert f"image: {spec['image']}" in component, "the same nginx image as the component"
    assert spec["entrypoint"] == ["nginx", "-e", "stderr", "-c", "/etc/engram-front/nginx.conf"]
    assert spec["volumes"] == ["./deploy/compose/front.conf:/etc/engram-front/nginx.conf:ro"]
    assert spec["ports"] == ["127.0.0.1:50061:50061"]
    # nginx resolves the shard's name once: it must restart when the shard is recreated.
    assert spec["depends_on"] == {"shard": {"condition": "service_healthy", "restart": True}}
    networks = _networks(compose)
    for network in networks[FRONT_SERVICE]:
        members = {name for name, nets in networks.items() if network in nets}
        assert members == {FRONT_SERVICE, "shard"}, f"{network}: {members}"

    config = (ROOT / "deploy" / "compose" / "front.conf").read_text()
    assert config == render("shard:50051", "0.0.0.0:50061", FrontLimits(16, 4, 50))
    [command] = [line.split("#", 1)[1].strip() for line in
                 (ROOT / "docker-compose.yml").read_text().splitlines()
                 if line.strip().startswith("#") and "engram front-config" in line]
    args = command.split()[1:]
    assert args[-2:] == ["-o", "deploy/compose/front.conf"]
    out = tmp_path / "front.conf"
    assert CliRunner().invoke(app, [*args[:-1], str(out)]).exit_code == 0
    assert out.read_text() == config, f"regenerate it: {command}"
    if NGINX is not None:  # the host name resolves only inside compose's network
        checked = nginx_check(config.replace("server shard:50051;", "server 127.0.0.1:50051;")
                              .replace("/tmp/", f"{tmp_path}/"), tmp_path)
        assert checked.returncode == 0, checked.stderr
