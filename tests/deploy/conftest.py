"""Deployment artefacts, checked offline: what each service is given, and what it accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from services.artifacts.settings import ArtifactsSettings
from services.compactor.settings import CompactorSettings
from services.embedder.settings import EmbedderSettings
from services.governance.settings import GovernanceSettings
from services.shard.settings import ShardSettings
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("shard", "governance", "artifacts", "compactor")
EMBEDDER = "embedder"
"""The shared embedding service (docs/embedder.md): optional, in the overlays with
components/embedder and the compose profile "embedder"; it has no database."""
GRPC_PORTS = {"shard": 50051, "governance": 50052, "artifacts": 50053, "compactor": 50054,
              EMBEDDER: 50055}
SETTINGS: dict[str, type[BaseSettings]] = {
    "shard": ShardSettings, "governance": GovernanceSettings,
    "artifacts": ArtifactsSettings, "compactor": CompactorSettings, EMBEDDER: EmbedderSettings,
}
# Who calls whom over gRPC (DESIGN.md section 1); nothing else may connect service to service.
SERVICE_EDGES = {("shard", "governance"), ("compactor", "shard"), ("compactor", "artifacts"),
                 ("artifacts", "governance"), ("compactor", "governance")}
"""Who calls whom: every service polls governance for revoked tokens and suspended agents."""
EMBEDDER_EDGES = {("shard", EMBEDDER), (EMBEDDER, "governance")}
"""With the embedder: the shard embeds through it; it polls governance. Nobody else calls it."""
EMBEDDER_OVERLAYS = ("prod-embedder", "prod-tls-embedder")
FRONT = "front"
"""The front proxy (components/front, docs/deploy.md): a container of this name beside the
shard's in each shard pod, with a container port of this name; the shard's Service and its
NetworkPolicy send every caller there."""
FRONT_PORT = 50061
FRONT_OVERLAYS = ("prod-front",)
# Read by boto3's default credential chain (the compactor's S3 client), not by Engram settings.
BOTO_ENV = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}


def accepted_env(service: str) -> set[str]:
    """Every ENGRAM_* variable the service's settings class reads."""
    cls = SETTINGS[service]
    prefix = str(cls.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for field, info in cls.model_fields.items():
        if isinstance(info.validation_alias, AliasChoices):
            names.update(str(choice) for choice in info.validation_alias.choices)
        else:
            names.add(f"{prefix}{field}".upper())
    return names


def parse_settings(service: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Build the service's settings from exactly ``env`` (the process environment cleared)."""
    import os

    for key in list(os.environ):
        if key.startswith("ENGRAM_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return SETTINGS[service]()


def kustomize(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    require(kubectl is not None, "kubectl is not installed: it renders the kustomize overlays")
    assert kubectl is not None
    result = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy" / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"kubectl kustomize {overlay} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="session", params=["dev", "prod", "prod-tls", *EMBEDDER_OVERLAYS,
                                                   *FRONT_OVERLAYS])
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, kustomize(request.param)


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded
