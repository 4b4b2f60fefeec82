"""components/embedder (overlays prod-embedder, prod-tls-embedder): the shard replicas embed
through engram-embedder, which only they reach, and which polls governance (docs/embedder.md).

The hardening, probes, secrets, settings and NetworkPolicy checks of test_kustomize.py cover
the embedder too in these overlays; this file checks what only the embedder has."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import EMBEDDER_OVERLAYS, ROOT, kustomize, parse_settings
from tests.deploy.test_kustomize import (
    Rendered,
    _container,
    _env,
    _memory,
    _objects,
    _port,
)

MEASURED_START_PEAK_MB = 600
"""docs/embedder.md, "Memory": MiniLM int8, the graph built and quantized at start."""


@pytest.fixture(scope="module", params=EMBEDDER_OVERLAYS)
def with_embedder(request: pytest.FixtureRequest) -> Rendered:
    return request.param, kustomize(request.param)


def _points_at_the_embedder(rendered: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard's ENGRAM_SHARD_EMBEDDER_ADDR is the embedder's Service and gRPC port, and that
    Service sends the calls to the embedder's pods on their gRPC port."""
    shard = parse_settings("shard", {**_env(rendered, "shard")[0],
                                     "ENGRAM_SHARD_DB_URL": "postgresql+psycopg://u:p@db/s"},
                           monkeypatch)
    assert shard.embedder_addr, f"{rendered[0]}: the shard runs its own encoder"
    host, _, port = shard.embedder_addr.rpartition(":")
    service = _objects(rendered, "Service").get(host)
    assert service is not None, f"{rendered[0]}: the shard calls {host}, which is no Service"
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert int(port) == grpc["port"] and grpc["targetPort"] == "grpc"
    deployment = _objects(rendered, "Deployment")["engram-embedder"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items(), "the Service selects the embedder"
    container = _container(rendered, "embedder")
    assert container["command"] == ["python", "-m", "services.embedder"]
    embedder = parse_settings("embedder", _env(rendered, "embedder")[0], monkeypatch)
    assert embedder.port == _port(container, "grpc")


def test_the_shard_embeds_through_the_embedder_service(
        with_embedder: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    _points_at_the_embedder(with_embedder, monkeypatch)


def test_the_check_fails_when_the_shard_does_not_point_at_the_embedder(
        with_embedder: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a shard left on its own encoder, or one pointed elsewhere."""
    name, objects = with_embedder
    for address in (None, "engram-governance:50052", "engram-embedder:50051"):
        changed = yaml.safe_load(yaml.safe_dump(objects))
        shard_config = _container((name, changed), "shard")["envFrom"][0]["configMapRef"]["name"]
        data = _objects((name, changed), "ConfigMap")[shard_config]["data"]
        data.pop("ENGRAM_SHARD_EMBEDDER_ADDR")
        if address is not None:
            data["ENGRAM_SHARD_EMBEDDER_ADDR"] = address
        with pytest.raises(AssertionError):
            _points_at_the_embedder((name, changed), monkeypatch)


def test_overlays_without_the_component_keep_the_shards_own_encoder(
        overlay: Rendered) -> None:
    plain, _ = _env(overlay, "shard")
    if overlay[0] in EMBEDDER_OVERLAYS:
        assert plain["ENGRAM_SHARD_EMBEDDER_ADDR"] == "engram-embedder:50055"
    else:
        assert not any(k.startswith("ENGRAM_SHARD_EMBEDDER_") for k in plain)
        assert not any("embedder" in o["metadata"]["name"] for o in overlay[1])


def test_the_embedder_polls_governance_with_its_own_token(
        with_embedder: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = parse_settings("embedder", _env(with_embedder, "embedder")[0], monkeypatch)
    assert settings.governance_addr == "engram-governance:50052"
    assert str(settings.service_token_file) == "/run/engram/auth/embedder.token"
    volumes = _objects(with_embedder, "Deployment")["engram-embedder"]["spec"]["template"][
        "spec"]["volumes"]
    projected = {source["secret"]["name"]: source["secret"].get("items")
                 for volume in volumes for source in volume.get("projected", {}).get("sources", [])}
    assert projected["engram-embedder-service-token"] == [{"key": "token",
                                                           "path": "embedder.token"}]
    if with_embedder[0].endswith("-tls-embedder"):
        assert "engram-embedder-tls" in projected
        assert settings.tls_client_ca is not None, "mutual TLS: only certified callers"


def test_the_embedders_memory_limit_holds_its_measured_start_peak(
        with_embedder: Rendered) -> None:
    resources = _container(with_embedder, "embedder")["resources"]
    assert _memory(resources["limits"]["memory"]) >= 1.25 * MEASURED_START_PEAK_MB * 2**20
    plain, _ = _env(with_embedder, "embedder")
    threads = int(plain.get("ENGRAM_EMBEDDER_THREADS", "2"))
    assert float(resources["limits"]["cpu"]) >= threads, "a core for each thread it runs"


def _with_components(tmp_path: Path, base: str, components: list[str]) -> list[dict[str, Any]]:
    """Overlay ``base`` with ``components`` added to its kustomization, as an operator adds
    one (its namespace, image and patches then apply to what the components bring)."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    source = ROOT / "deploy" / "overlays" / base
    overlay = tmp_path / base
    shutil.copytree(source, overlay)
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["resources"] = [
        os.path.relpath((source / r).resolve(), overlay) if (source / r).is_dir() else r
        for r in kustomization["resources"]]
    kustomization["components"] = [
        *(os.path.relpath((source / c).resolve(), overlay)
          for c in kustomization.get("components", [])),
        *(os.path.relpath(ROOT / "deploy" / "components" / c, overlay) for c in components)]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    result = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_component_adds_the_embedder_to_any_overlay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kustomize("dev")  # kubectl is there (or the test is skipped)
    rendered = ("dev+embedder", _with_components(tmp_path, "dev", ["embedder"]))
    _points_at_the_embedder(rendered, monkeypatch)
    policies = _objects(rendered, "NetworkPolicy")
    peers = [peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
             for peer in policies["engram-governance-ingress"]["spec"]["ingress"][0]["from"]]
    assert "engram-embedder" in peers, "the embedder must reach governance (revocations)"
    assert {o["metadata"].get("namespace") for o in rendered[1]
            if o["kind"] != "Namespace"} == {"engram-dev"}
    images = {c["image"] for o in _objects(rendered, "Deployment").values()
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {"engram:dev"}
    # dev's patch of every Engram Deployment (small requests) reaches the embedder too.
    resources = _container(rendered, "embedder")["resources"]
    assert resources["requests"]["cpu"] == "50m"
