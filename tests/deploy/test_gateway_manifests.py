"""The HTTP gateway in the kustomize overlays: what it runs, where it calls, who reaches it."""

from __future__ import annotations

from engram.client import ClientSettings
from tests.deploy.conftest import SERVICES
from tests.deploy.test_kustomize import (
    PROBES,
    Rendered,
    _container,
    _entry_port,
    _env,
    _matches,
    _objects,
    _peer,
)


def test_the_gateway_runs_engram_gateway_hardened(overlay: Rendered) -> None:
    container = _container(overlay, "gateway")
    assert container["command"][:2] == ["engram", "gateway"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = str(ports["http"])
    assert container["command"][container["command"].index("--port") + 1] == port
    for probe in PROBES:
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]) == {"requests", "limits"}
    service = _objects(overlay, "Service")["engram-gateway"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


def test_the_gateway_calls_each_service_by_its_service_name(overlay: Rendered) -> None:
    plain, secret_backed = _env(overlay, "gateway")
    assert not secret_backed, "the gateway holds no token: each request brings its own"
    settings = ClientSettings(plain)
    services = _objects(overlay, "Service")
    for name in SERVICES:
        host, port = getattr(settings, f"{name}_addr").split(":")
        assert host == f"engram-{name}"
        grpc = next(p for p in services[host]["spec"]["ports"] if p["name"] == "grpc")
        assert int(port) == grpc["port"]
    if "tls" in overlay[0].split("-"):
        assert settings.tls_ca and settings.tls_cert and settings.tls_key


def test_the_gateway_reaches_the_four_and_only_clients_reach_it(overlay: Rendered) -> None:
    policies = list(_objects(overlay, "NetworkPolicy").values())
    deployments = _objects(overlay, "Deployment")

    def callers(name: str) -> set[tuple[str, str]]:
        labels = deployments[f"engram-{name}"]["spec"]["template"]["metadata"]["labels"]
        found: set[tuple[str, str]] = set()
        for policy in policies:
            if _matches(policy["spec"]["podSelector"], labels):
                for rule in policy["spec"].get("ingress", []):
                    found |= {(_peer(peer), str(port["port"])) for peer in rule["from"]
                              for port in rule["ports"]}
        return found

    for name in SERVICES:
        # On the service's gRPC port, or its front proxy's where it has one.
        assert ("gateway", _entry_port(overlay, name)) in callers(name), name
    gateway: set[tuple[str, str]] = {pair for pair in callers("gateway")
                                     if not pair[0].startswith("monitoring:")}
    assert gateway == {("client", "http")}
