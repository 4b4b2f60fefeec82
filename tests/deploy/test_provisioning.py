"""The scripts that provision keys, tokens, buckets and Secrets, run for real on this machine."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from services.common.tokens import (
    Principal,
    TokenVerifier,
    rotate_signing_key,
)
from tests.conftest import inspect_token, require
from tests.deploy.conftest import EMBEDDER, ROOT, SERVICES, kustomize
from tests.pki import issue, write_pair

BIN = str(Path(sys.executable).parent)


def _script_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "AWS_"))}
    env.update(PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}", PYTHONPATH=str(ROOT), **extra)
    return env


def _verify(public_key: Path, token_file: Path) -> Principal:
    return TokenVerifier.load(public_key).verify(token_file.read_text().strip())


def _provision(tmp_path: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    env = _script_env(ENGRAM_SIGNING_HOME=str(tmp_path / "signing"),
                      ENGRAM_AUTH_ROOT=str(tmp_path / "run"), ENGRAM_HOME=str(tmp_path / "home"),
                      ENGRAM_S3_ENDPOINT_URL=endpoint,
                      ENGRAM_S3_BUCKETS="engram-artifacts engram-compactor",
                      AWS_ACCESS_KEY_ID="engram-dev", AWS_SECRET_ACCESS_KEY="engram-dev-secret",
                      AWS_DEFAULT_REGION="us-east-1")
    return subprocess.run(["sh", str(ROOT / "deploy" / "compose" / "provision.sh")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_compose_init_provisions_keys_tokens_and_buckets_once(
        tmp_path: Path, moto_endpoint: str) -> None:
    first = _provision(tmp_path, moto_endpoint)
    assert first.returncode == 0, first.stderr
    signing, run = tmp_path / "signing" / "auth", tmp_path / "run"
    public = signing / "signing.pub"
    admin = _verify(public, signing / "admin.token")
    assert admin.roles == {"admin", "governor"} and admin.fleet_id == "default"
    callers = ("shard", "artifacts", "compactor", EMBEDDER)
    for service in callers:
        principal = _verify(run / service / "signing.pub", run / service / f"{service}.token")
        assert (principal.agent_id, principal.fleet_id, principal.roles) == (
            f"svc-{service}", "system", frozenset({"service"}))
        assert principal.expires_at - principal.issued_at == 30 * 86400
    audience = inspect_token((run / "compactor" / "compactor.token").read_text().strip())
    assert audience["claims"]["aud"] == ["artifacts", "governance", "shard"]
    embedder = inspect_token((run / EMBEDDER / f"{EMBEDDER}.token").read_text().strip())
    assert embedder["claims"]["aud"] == ["governance"], "it calls governance alone"
    for service in (*SERVICES, EMBEDDER):
        files = {p.name for p in (run / service).iterdir()}
        expected = {"signing.pub", f"{service}.token"} if service in callers else {
            "signing.pub"}
        assert files == expected, f"{service} gets {files}"
        if os.geteuid() == 0:
            assert all(p.stat().st_uid == 10001 and p.stat().st_mode & 0o077 == 0
                       for p in (run / service).iterdir())
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                      aws_access_key_id="engram-dev", aws_secret_access_key="engram-dev-secret")
    assert {b["Name"] for b in s3.list_buckets()["Buckets"]} == {"engram-artifacts",
                                                               "engram-compactor"}
    tokens = {p: p.read_bytes() for p in [signing / "signing.key", *run.glob("*/*")]}
    second = _provision(tmp_path, moto_endpoint)
    assert second.returncode == 0, second.stderr
    assert {p: p.read_bytes() for p in tokens} == tokens, "a second run must keep key and tokens"


def _secrets_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    urls = {f"ENGRAM_{s.upper()}_DB_URL": f"postgresql+psycopg://engram_{s}:pw@db/engram_{s}"
            for s in SERVICES}
    return _script_env(ENGRAM_NAMESPACE="engram", ENGRAM_SIGNING_HOME=str(tmp_path / "signing"),
                       ENGRAM_HOME=str(tmp_path / "home"), **urls, **extra)


def _run_secrets(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    require(shutil.which("kubectl", path=env["PATH"]) is not None,
            "kubectl is not installed: deploy/secrets.sh uses it to write Secrets")
    return subprocess.run(["sh", str(ROOT / "deploy" / "secrets.sh")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _referenced_secrets(objects: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """(required, optional) Secret names the Deployments reference."""
    required: set[str] = set()
    optional: set[str] = set()
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        spec = obj["spec"]["template"]["spec"]
        for var in spec["containers"][0].get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                (optional if ref.get("optional") else required).add(ref["name"])
        for volume in spec["volumes"]:
            for source in volume.get("projected", {}).get("sources", []):
                if "secret" in source:
                    required.add(source["secret"]["name"])
    return required, optional


def test_secrets_script_writes_every_secret_the_overlays_need(tmp_path: Path) -> None:
    result = _run_secrets(_secrets_env(tmp_path, ENGRAM_S3_ACCESS_KEY_ID="AKIA",
                                       ENGRAM_S3_SECRET_ACCESS_KEY="s3cr3t"))
    assert result.returncode == 0, result.stderr
    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(result.stdout) if d}
    version = kubernetes_validate.latest_version()
    for secret in secrets.values():
        assert secret["kind"] == "Secret" and secret["metadata"]["namespace"] == "engram"
        kubernetes_validate.validate(secret, version, strict=True)
    required, optional = _referenced_secrets(kustomize("prod"))
    assert required <= set(secrets), f"missing {sorted(required - set(secrets))}"
    assert set(secrets) == required | optional

    def value(name: str, key: str) -> str:
        return base64.b64decode(secrets[name]["data"][key]).decode()

    assert value("engram-shard-db", "url").endswith("/engram_shard")
    public = tmp_path / "signing.pub"
    public.write_text(value("engram-auth-public-key", "signing.pub"))
    for service in ("shard", "artifacts", "compactor"):
        token = tmp_path / f"{service}.token"
        token.write_text(value(f"engram-{service}-service-token", "token"))
        assert _verify(public, token).roles == {"service"}
    assert "PRIVATE KEY" not in result.stdout, "the signing key never leaves its directory"


def test_secrets_script_publishes_retired_keys_during_a_rotation(tmp_path: Path) -> None:
    env = _secrets_env(tmp_path)
    first = _run_secrets(env)
    assert first.returncode == 0, first.stderr
    old_kid, new_kid = rotate_signing_key(tmp_path / "signing")
    rotated = _run_secrets(env)
    assert rotated.returncode == 0, rotated.stderr
    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(rotated.stdout) if d}
    keys = secrets["engram-auth-public-key"]["data"]
    assert set(keys) == {"signing.pub", f"{old_kid}.pub"}
    for name in keys:
        (tmp_path / "mounted").mkdir(exist_ok=True)
        (tmp_path / "mounted" / name).write_bytes(base64.b64decode(keys[name]))
    verifier = TokenVerifier.load(tmp_path / "mounted")
    assert verifier.key_ids == {old_kid, new_kid}
    token = base64.b64decode(secrets["engram-shard-service-token"]["data"]["token"]).decode()
    token = token.strip()
    assert inspect_token(token)["header"]["kid"] == new_kid, "new tokens use the new key"


def _tls_dir(tmp_path: Path,
             services: tuple[str, ...] = (*SERVICES, "gateway", EMBEDDER)) -> Path:
    directory = tmp_path / "tls"
    directory.mkdir()
    ca_cert, ca_key = issue("engram-ca", x509.Name([]), None, ca=True)  # type: ignore[arg-type]
    write_pair(directory, "ca", ca_cert, ca_key)
    for service in services:
        cert, key = issue(f"engram-{service}", ca_cert.subject, ca_key, ca=False, server=True)
        write_pair(directory, service, cert, key)
    return directory


def test_secrets_script_writes_the_tls_secrets_of_the_tls_overlay(tmp_path: Path) -> None:
    tls = _tls_dir(tmp_path)
    result = _run_secrets(_secrets_env(tmp_path, ENGRAM_S3_ACCESS_KEY_ID="AKIA",
                                       ENGRAM_S3_SECRET_ACCESS_KEY="s3cr3t",
                                       ENGRAM_TLS_DIR=str(tls)))
    assert result.returncode == 0, result.stderr
    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(result.stdout) if d}
    required, optional = _referenced_secrets(kustomize("prod-tls"))
    assert set(secrets) == required | optional
    version = kubernetes_validate.latest_version()
    for service in (*SERVICES, "gateway"):
        secret = secrets[f"engram-{service}-tls"]
        kubernetes_validate.validate(secret, version, strict=True)
        assert secret["type"] == "kubernetes.io/tls"
        data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
        assert data == {"tls.crt": (tls / f"{service}.crt").read_bytes(),
                        "tls.key": (tls / f"{service}.key").read_bytes(),
                        "ca.crt": (tls / "ca.crt").read_bytes()}


@pytest.mark.parametrize("overlay", ["prod-embedder", "prod-tls-embedder"])
def test_secrets_script_with_the_embedder_writes_what_its_overlays_need(
        tmp_path: Path, overlay: str) -> None:
    extra = {"ENGRAM_TLS_DIR": str(_tls_dir(tmp_path))} if "tls" in overlay else {}
    result = _run_secrets(_secrets_env(tmp_path, ENGRAM_WITH_EMBEDDER="1",
                                       ENGRAM_S3_ACCESS_KEY_ID="AKIA",
                                       ENGRAM_S3_SECRET_ACCESS_KEY="s3cr3t", **extra))
    assert result.returncode == 0, result.stderr
    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(result.stdout) if d}
    required, optional = _referenced_secrets(kustomize(overlay))
    assert set(secrets) == required | optional
    version = kubernetes_validate.latest_version()
    for secret in secrets.values():
        kubernetes_validate.validate(secret, version, strict=True)
    token = tmp_path / "embedder.token"
    token.write_bytes(base64.b64decode(secrets["engram-embedder-service-token"]["data"]["token"]))
    public = tmp_path / "signing.pub"
    public.write_bytes(base64.b64decode(secrets["engram-auth-public-key"]["data"]["signing.pub"]))
    principal = _verify(public, token)
    assert (principal.agent_id, principal.fleet_id, principal.roles) == (
        "svc-embedder", "system", frozenset({"service"}))
    assert inspect_token(token.read_text().strip())["claims"]["aud"] == ["governance"]


def test_secrets_script_leaves_the_embedder_out_unless_asked(tmp_path: Path) -> None:
    result = _run_secrets(_secrets_env(tmp_path, ENGRAM_TLS_DIR=str(_tls_dir(tmp_path))))
    assert result.returncode == 0, result.stderr
    assert "engram-embedder" not in result.stdout
    refused = _run_secrets(_secrets_env(tmp_path, ENGRAM_WITH_EMBEDDER="yes"))
    assert refused.returncode == 2 and "ENGRAM_WITH_EMBEDDER" in refused.stderr
    assert refused.stdout == ""
    (tmp_path / "partial").mkdir()
    no_cert = _tls_dir(tmp_path / "partial", services=(*SERVICES, "gateway"))
    missing = _run_secrets(_secrets_env(tmp_path, ENGRAM_WITH_EMBEDDER="1",
                                        ENGRAM_TLS_DIR=str(no_cert)))
    assert missing.returncode == 2 and "embedder.crt" in missing.stderr
    assert missing.stdout == ""


def test_secrets_script_checks_the_tls_files_before_printing_anything(tmp_path: Path) -> None:
    tls = _tls_dir(tmp_path, services=("shard", "governance", "artifacts"))
    result = _run_secrets(_secrets_env(tmp_path, ENGRAM_TLS_DIR=str(tls)))
    assert result.returncode == 2
    assert "compactor.crt" in result.stderr and result.stdout == ""


def test_secrets_script_refuses_without_a_database_url(tmp_path: Path) -> None:
    env = _secrets_env(tmp_path)
    del env["ENGRAM_GOVERNANCE_DB_URL"]
    result = _run_secrets(env)
    assert result.returncode == 2
    assert "ENGRAM_GOVERNANCE_DB_URL" in result.stderr and result.stdout == ""
