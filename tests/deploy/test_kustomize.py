"""`kubectl kustomize deploy/overlays/<x>`: valid objects, hardened pods, the trust boundaries."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

import kubernetes_validate
import pytest

from services.common.server import LIVENESS
from tests.deploy.conftest import (
    BOTO_ENV,
    EMBEDDER,
    EMBEDDER_EDGES,
    EMBEDDER_OVERLAYS,
    FRONT,
    FRONT_OVERLAYS,
    GRPC_PORTS,
    SERVICE_EDGES,
    SERVICES,
    accepted_env,
    parse_settings,
)

Rendered = tuple[str, list[dict[str, Any]]]
CLIENT = "client"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _objects(rendered: Rendered, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in rendered[1] if o["kind"] == kind}


def _services(rendered: Rendered) -> tuple[str, ...]:
    """The four, and the embedder where the overlay has components/embedder."""
    has_embedder = f"engram-{EMBEDDER}" in _objects(rendered, "Deployment")
    assert has_embedder == (rendered[0] in EMBEDDER_OVERLAYS), rendered[0]
    return (*SERVICES, EMBEDDER) if has_embedder else SERVICES


def _deployment(rendered: Rendered, service: str) -> dict[str, Any]:
    return _objects(rendered, "Deployment")[f"engram-{service}"]


def _sidecars(rendered: Rendered, service: str) -> set[str]:
    """The containers a service's pod runs beside the service's own: the front proxy beside
    the shard in the overlays with components/front; none elsewhere."""
    return {FRONT} if service == "shard" and rendered[0] in FRONT_OVERLAYS else set()


def _container(rendered: Rendered, service: str) -> dict[str, Any]:
    """The service's own container: the one named after it, first in the pod (the overlays'
    patches address containers/0)."""
    containers = _deployment(rendered, service)["spec"]["template"]["spec"]["containers"]
    names = [c["name"] for c in containers]
    assert sorted(names) == sorted({service} | _sidecars(rendered, service)), (
        f"{rendered[0]}: {service}'s pod runs {names}")
    assert names[0] == service, f"{rendered[0]}: {service}'s own container is not first: {names}"
    return dict(containers[0])


def _pod_containers(rendered: Rendered, service: str) -> list[dict[str, Any]]:
    spec = _deployment(rendered, service)["spec"]["template"]["spec"]
    return [*spec["containers"], *spec.get("initContainers", [])]


def _entry_port(rendered: Rendered, service: str) -> str:
    """The pod port the service's callers reach: its Service's grpc targetPort and the port
    its NetworkPolicy admits them on. The front proxy's where there is one, else the service's
    own gRPC port."""
    return FRONT if FRONT in _sidecars(rendered, service) else "grpc"


def _port(container: dict[str, Any], name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert name in ports, f"{container['name']} has no port named {name!r}"
    return int(ports[name])


def _env(rendered: Rendered, service: str) -> tuple[dict[str, str], dict[str, str]]:
    """(plain values from ConfigMaps and env, secret-backed variable -> secret name)."""
    config_maps = _objects(rendered, "ConfigMap")
    container = _container(rendered, service)
    plain: dict[str, str] = {}
    secret_backed: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert set(source) == {"configMapRef"}, f"{service}: envFrom {source} (secrets go in env)"
        plain.update(config_maps[source["configMapRef"]["name"]]["data"])
    for var in container.get("env", []):
        if "value" in var:
            plain[var["name"]] = var["value"]
        else:
            secret_backed[var["name"]] = var["valueFrom"]["secretKeyRef"]["name"]
    return plain, secret_backed


def _secret_names(pod_spec: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for container in pod_spec["containers"]:
        names.update(v["valueFrom"]["secretKeyRef"]["name"] for v in container.get("env", [])
                     if "secretKeyRef" in v.get("valueFrom", {}))
        names.update(s["secretRef"]["name"] for s in container.get("envFrom", [])
                     if "secretRef" in s)
    for volume in pod_spec.get("volumes", []):
        if "secret" in volume:
            names.add(volume["secret"]["secretName"])
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                names.add(source["secret"]["name"])
    return names


def test_every_object_validates_against_the_newest_kubernetes_schema(overlay: Rendered) -> None:
    version = kubernetes_validate.latest_version()
    for obj in overlay[1]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{overlay[0]}: {obj['kind']}/{obj['metadata']['name']} is not valid "
                        f"Kubernetes {version}: {error.message}")


def test_each_service_has_deployment_service_and_serviceaccount(overlay: Rendered) -> None:
    for service in _services(overlay):
        name = f"engram-{service}"
        deployment = _deployment(overlay, service)
        assert name in _objects(overlay, "ServiceAccount")
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == name
        svc = _objects(overlay, "Service")[name]
        assert svc["spec"]["selector"].items() <= (
            deployment["spec"]["template"]["metadata"]["labels"].items())
        ports = {p["name"]: p for p in svc["spec"]["ports"]}
        assert ports["grpc"]["port"] == GRPC_PORTS[service]
        assert ports["grpc"]["targetPort"] == _entry_port(overlay, service), service
        assert ports["metrics"]["targetPort"] == "metrics"


def test_all_objects_live_in_the_overlay_namespace_which_enforces_restricted(
        overlay: Rendered) -> None:
    namespaces = _objects(overlay, "Namespace")
    assert len(namespaces) == 1
    (name, namespace), = namespaces.items()
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in overlay[1]:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == name, obj["metadata"]["name"]


def test_pods_run_non_root_with_read_only_root_and_no_capabilities(overlay: Rendered) -> None:
    for service in _services(overlay):
        spec = _deployment(overlay, service)["spec"]["template"]["spec"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, service
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", service
        assert spec["automountServiceAccountToken"] is False, service
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["runAsNonRoot"] is True, service
            assert ctx.get("runAsUser", pod["runAsUser"]) != 0, service
            assert ctx["readOnlyRootFilesystem"] is True, service
            assert ctx["allowPrivilegeEscalation"] is False, service
            assert ctx["capabilities"]["drop"] == ["ALL"], service
            assert not ctx["capabilities"].get("add"), service
            assert ctx.get("privileged", False) is False, service
            assert ctx["seccompProfile"]["type"] == "RuntimeDefault", service
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], f"{service}: /tmp must be an emptyDir"


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _memory(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def test_every_container_has_requests_within_limits(overlay: Rendered) -> None:
    for service in _services(overlay):
        _container(overlay, service)  # the pod runs exactly its expected containers
        for container in _pod_containers(overlay, service):
            resources = container["resources"]
            which = (service, container["name"])
            for key in ("cpu", "memory"):
                assert key in resources["requests"] and key in resources["limits"], (which, key)
            assert _cpu(resources["requests"]["cpu"]) <= _cpu(resources["limits"]["cpu"]), which
            assert _memory(resources["requests"]["memory"]) <= _memory(
                resources["limits"]["memory"]), which


def test_probes_are_native_grpc_on_a_plaintext_port(overlay: Rendered) -> None:
    """On the gRPC port; with TLS on, on the health-only port (native probes cannot do TLS)."""
    for service in _services(overlay):
        container = _container(overlay, service)
        plain, _ = _env(overlay, service)
        grpc_port = _port(container, "grpc")
        assert grpc_port == GRPC_PORTS[service]
        tls = f"ENGRAM_{service.upper()}_TLS_CERT" in plain
        probed = _port(container, "health") if tls else grpc_port
        if tls:
            assert plain[f"ENGRAM_{service.upper()}_HEALTH_PORT"] == str(probed), service
        for probe in PROBES:
            handlers = set(container[probe]) & {"grpc", "httpGet", "tcpSocket", "exec"}
            assert handlers == {"grpc"}, f"{service} {probe} uses {handlers}"
            assert container[probe]["grpc"]["port"] == probed, f"{service} {probe}"
            # The empty service name is the server's overall health, its readiness; liveness
            # asks LIVENESS, alive while the database is away (a restart then cannot start).
            wanted = LIVENESS if probe == "livenessProbe" else ""
            assert container[probe]["grpc"].get("service", "") == wanted, f"{service} {probe}"


def test_tls_overlays_secure_every_server_and_every_call(
        overlay: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    name, _ = overlay
    with_tls = "tls" in name.split("-")  # prod-tls, prod-tls-embedder
    settings = {s: parse_settings(s, _env(overlay, s)[0], monkeypatch)
                for s in _services(overlay)}
    for service, parsed in settings.items():
        tls = (parsed.tls_cert, parsed.tls_key, parsed.tls_client_ca)
        if not with_tls:
            assert tls == (None, None, None) and parsed.health_port is None, service
            continue
        assert None not in tls, f"{service}: mutual TLS needs a certificate, key and client CA"
        assert parsed.health_port == _port(_container(overlay, service), "health"), service
    if with_tls:
        clients = [settings["shard"].governance_tls(), settings["compactor"].shard_tls(),
                   settings["artifacts"].governance_tls(), settings["compactor"].governance_tls()]
        if EMBEDDER in settings:  # the shard's calls to it, and its own to governance
            clients += [settings["shard"].embedder_tls(), settings[EMBEDDER].governance_tls()]
        for client in clients:
            assert client.get("tls_ca") and client.get("tls_cert") and client.get("tls_key")


def test_one_image_runs_each_service_module(overlay: Rendered) -> None:
    images = {_container(overlay, s)["image"] for s in _services(overlay)}
    assert len(images) == 1, images
    for service in _services(overlay):
        assert _container(overlay, service)["command"] == ["python", "-m", f"services.{service}"]


def test_env_names_are_real_settings_and_parse(overlay: Rendered,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for service in _services(overlay):
        container = _container(overlay, service)
        plain, secret_backed = _env(overlay, service)
        names = set(plain) | set(secret_backed)
        engram = {n for n in names if n.startswith("ENGRAM_")}
        assert engram <= accepted_env(service), (
            f"{service}: {sorted(engram - accepted_env(service))} are not settings it reads")
        assert names - engram <= (BOTO_ENV if service == "compactor" else set()), service
        env = {**plain, **{n: "secret" for n in secret_backed if n.startswith("ENGRAM_")}}
        if service != EMBEDDER:  # the embedding service stores nothing
            assert secret_backed[f"ENGRAM_{service.upper()}_DB_URL"] == f"engram-{service}-db"
            env[f"ENGRAM_{service.upper()}_DB_URL"] = "postgresql+psycopg://u:p@db:5432/engram"
        else:
            assert not secret_backed, f"{service}: only files (its token) come from Secrets"
        settings = parse_settings(service, env, monkeypatch)
        assert settings.host == "0.0.0.0", service
        assert settings.port == _port(container, "grpc"), service
        assert settings.metrics_port == _port(container, "metrics"), service
        if service != EMBEDDER:
            assert settings.database_url().startswith("postgresql"), service


def test_dependency_addresses_name_the_callee_services(overlay: Rendered) -> None:
    shard, _ = _env(overlay, "shard")
    compactor, _ = _env(overlay, "compactor")
    assert shard["ENGRAM_SHARD_GOVERNANCE_ADDR"] == "engram-governance:50052"
    assert compactor["ENGRAM_COMPACTOR_SHARD_ADDR"] == "engram-shard:50051"
    artifacts, _ = _env(overlay, "artifacts")
    for env, prefix in ((artifacts, "ENGRAM_ARTIFACTS_"), (compactor, "ENGRAM_COMPACTOR_")):
        assert env[f"{prefix}GOVERNANCE_ADDR"] == "engram-governance:50052"
        assert env[f"{prefix}SERVICE_TOKEN_FILE"].startswith("/run/engram/auth/")
    for url in (artifacts["ENGRAM_ARTIFACTS_BLOB_URL"], compactor["ENGRAM_COMPACTOR_BLOB_URL"]):
        assert url.startswith("s3://")
    assert artifacts["ENGRAM_ARTIFACTS_S3_ENDPOINT_URL"].startswith(("http://", "https://"))
    assert compactor["ENGRAM_COMPACTOR_S3_ENDPOINT_URL"] == (
        artifacts["ENGRAM_ARTIFACTS_S3_ENDPOINT_URL"])


def test_each_service_references_only_its_own_secrets(overlay: Rendered) -> None:
    for service in _services(overlay):
        spec = _deployment(overlay, service)["spec"]["template"]["spec"]
        for name in _secret_names(spec):
            assert name == "engram-auth-public-key" or name.startswith(f"engram-{service}-"), (
                f"{service} references {name}")


def test_shard_never_sees_the_governance_database(overlay: Rendered) -> None:
    shard = _deployment(overlay, "shard")
    text = json.dumps(shard).lower()
    assert "governance-db" not in text and "governance_db" not in text
    assert "engram-governance-db" not in _secret_names(shard["spec"]["template"]["spec"])
    plain, secret_backed = _env(overlay, "shard")
    assert not any("GOVERNANCE_DB" in n or n.startswith("ENGRAM_GOVERNANCE_")
                   for n in [*plain, *secret_backed])
    assert not any("engram_governance" in v for v in plain.values())


def test_file_settings_point_at_mounted_secret_items(overlay: Rendered) -> None:
    for service in _services(overlay):
        spec = _deployment(overlay, service)["spec"]["template"]["spec"]
        container = _container(overlay, service)
        plain, _ = _env(overlay, service)
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        files = {k: v for k, v in plain.items()
                 if k.endswith("_FILE") or k == "ENGRAM_AUTH_PUBLIC_KEY"
                 or k.endswith(("_TLS_CERT", "_TLS_KEY", "_TLS_CA", "_TLS_CLIENT_CA"))}
        assert "ENGRAM_AUTH_PUBLIC_KEY" in files
        if service in ("shard", "compactor", EMBEDDER):
            assert f"ENGRAM_{service.upper()}_SERVICE_TOKEN_FILE" in files
        for name, value in files.items():
            path = PurePosixPath(value)
            volume = mounts.get(str(path.parent))
            assert volume is not None, f"{service}: {name}={value} is not on a mounted volume"
            items = {item["path"] for source in volume["projected"]["sources"]
                     for item in source["secret"].get("items", [])}
            whole = {source["secret"]["name"] for source in volume["projected"]["sources"]
                     if "items" not in source["secret"]}
            # A Secret projected whole is the public keys (signing.pub and retired ones).
            assert path.name in items or whole == {"engram-auth-public-key"}, (
                f"{service}: {name}={value} is not a projected item")
        # Every verification key: the directory the public-key Secret is projected into.
        assert mounts.get(plain["ENGRAM_AUTH_PUBLIC_KEYS"]) is not None, service


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"unsupported selector {selector}"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer(peer: dict[str, Any]) -> str:
    """The caller a NetworkPolicy peer names: an Engram service, or the opted-in clients."""
    assert "ipBlock" not in peer, f"ipBlock peers bypass the boundaries: {peer}"
    if "namespaceSelector" in peer:
        if peer.get("podSelector") == {"matchLabels": {"engram.dev/client": "true"}}:
            assert peer["namespaceSelector"] == {"matchLabels": {"engram.dev/clients": "allowed"}}
            return CLIENT
        assert "podSelector" not in peer, peer
        return "monitoring:" + json.dumps(peer["namespaceSelector"], sort_keys=True)
    name = peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
    assert set(peer["podSelector"]["matchLabels"]) == {"app.kubernetes.io/name"}
    return str(name).removeprefix("engram-")


def _allowed(rendered: Rendered) -> dict[str, set[tuple[str, str]]]:
    """Per service, the (caller, port name) pairs the NetworkPolicies let in."""
    policies = list(_objects(rendered, "NetworkPolicy").values())
    allowed: dict[str, set[tuple[str, str]]] = {}
    for service in _services(rendered):
        labels = _deployment(rendered, service)["spec"]["template"]["metadata"]["labels"]
        allowed[service] = set()
        for policy in policies:
            if not _matches(policy["spec"]["podSelector"], labels):
                continue
            for rule in policy["spec"].get("ingress", []):
                assert rule.get("from") and rule.get("ports"), (
                    f"{policy['metadata']['name']}: a rule without from/ports opens everything")
                for peer in rule["from"]:
                    for port in rule["ports"]:
                        allowed[service].add((_peer(peer), str(port["port"])))
    return allowed


def test_default_deny_ingress_covers_every_pod(overlay: Rendered) -> None:
    denies = [p for p in _objects(overlay, "NetworkPolicy").values()
              if p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"]
              and not p["spec"].get("ingress")]
    assert denies, "no default-deny ingress NetworkPolicy"


def test_network_policy_edges_are_exactly_the_trust_boundaries(overlay: Rendered) -> None:
    allowed = _allowed(overlay)
    services = _services(overlay)
    entry = {service: _entry_port(overlay, service) for service in services}
    grpc_edges = {(caller, callee) for callee, pairs in allowed.items()
                  for caller, port in pairs if port == entry[callee] and caller in services}
    assert grpc_edges == (SERVICE_EDGES | EMBEDDER_EDGES if EMBEDDER in services
                          else SERVICE_EDGES)
    client_targets = {callee for callee, pairs in allowed.items()
                      if (CLIENT, entry[callee]) in pairs}
    assert client_targets == {"shard", "artifacts", "compactor"}, "governance takes no clients"
    for callee, pairs in allowed.items():
        for caller, port in pairs:
            assert port in (entry[callee], "metrics"), (callee, caller, port)
            if caller.startswith("monitoring:"):
                assert port == "metrics", f"monitoring may only scrape {callee}"
            else:
                assert port == entry[callee], (
                    f"{caller} may reach {callee} only on {entry[callee]}")
        assert any(c.startswith("monitoring:") for c, _ in pairs), f"{callee} is not scraped"


def test_named_policy_ports_exist_on_every_selected_pod(overlay: Rendered) -> None:
    """Each named port once in the pod (a name two containers declare is ambiguous)."""
    for service in _services(overlay):
        _container(overlay, service)
        names = [p["name"] for c in _deployment(overlay, service)["spec"]["template"]["spec"][
            "containers"] for p in c.get("ports", [])]
        assert len(names) == len(set(names)), f"{service}: port names {names}"
        for _caller, port in _allowed(overlay)[service]:
            assert port in names, f"{service}'s pod has no port named {port!r}"


def test_replicas_and_rollout_per_overlay(overlay: Rendered) -> None:
    name, _ = overlay
    replicas = {s: _deployment(overlay, s)["spec"]["replicas"] for s in _services(overlay)}
    compactor = _deployment(overlay, "compactor")
    assert replicas["compactor"] == 1 and compactor["spec"]["strategy"]["type"] == "Recreate"
    if name == "dev":
        assert set(replicas.values()) == {1}
    else:
        replicated = [s for s in replicas if s != "compactor"]
        assert all(replicas[s] >= 2 for s in replicated), replicas
        budgets = _objects(overlay, "PodDisruptionBudget")
        # The gateway too: with one replica and no budget every node drain was an HTTP
        # outage (found in review, 2026-11-30).
        assert _objects(overlay, "Deployment")["engram-gateway"]["spec"]["replicas"] >= 2
        for service in [*replicated, "gateway"]:
            assert budgets[f"engram-{service}"]["spec"]["selector"]["matchLabels"] == {
                "app.kubernetes.io/name": f"engram-{service}"}


def test_the_artifacts_spool_is_a_volume_of_its_own_that_holds_the_largest_upload(
        overlay: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every upload to S3 is spooled whole first. The spool was under /tmp, an emptyDir of
    256Mi: one upload over it (the limit is 5 GiB), or a few large ones at once, had the kubelet
    evict the pod, every call on it lost (found in review, 2026-11-30)."""
    settings = parse_settings("artifacts", _env(overlay, "artifacts")[0], monkeypatch)
    spool = PurePosixPath(settings.blob_store_options()["spool_dir"])
    container = _container(overlay, "artifacts")
    volumes = {v["name"]: v for v in
               _deployment(overlay, "artifacts")["spec"]["template"]["spec"]["volumes"]}
    mount = max((m for m in container["volumeMounts"]
                 if spool.is_relative_to(m["mountPath"])), key=lambda m: len(m["mountPath"]))
    assert mount["mountPath"] != "/tmp", f"the spool {spool} is on /tmp"
    size = volumes[mount["name"]]["emptyDir"]["sizeLimit"]
    assert _memory(size) >= 2 * settings.max_upload_bytes, (size, settings.max_upload_bytes)


REBUILD_WORST_SECONDS = 25 * 60
"""docs/scaling.md: a new shard pod rebuilds its index of 1M records in 7-25 min."""


def test_the_shards_startup_budget_covers_a_rebuild_of_a_million_records(
        overlay: Rendered) -> None:
    probe = _container(overlay, "shard")["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= REBUILD_WORST_SECONDS
