"""components/front (overlay prod-front): nginx beside each shard container refuses the calls
over its limits before they reach the shard (docs/deploy.md, "The front proxy").

The hardening, resource, Service and NetworkPolicy checks of test_kustomize.py cover the
sidecar too in prod-front (the Service's grpc port and the callers' port are `front` there);
this file checks what only the proxy has: its configuration is the generator's, the Service
reaches the shard through it, and it reaches the shard."""

from __future__ import annotations

import base64
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from typer.testing import CliRunner

from engram.cli.main import app
from engram.front import FrontLimits, render
from tests.deploy.conftest import FRONT, FRONT_OVERLAYS, FRONT_PORT, GRPC_PORTS, ROOT, kustomize
from tests.deploy.test_embedder_manifests import _with_components
from tests.deploy.test_kustomize import CLIENT, Rendered, _allowed, _objects
from tests.front import nginx_check

COMPONENT = ROOT / "deploy" / "components" / "front"
CONFIG = COMPONENT / "nginx.conf"
UPSTREAM = "127.0.0.1:50051"
LISTEN = f"0.0.0.0:{FRONT_PORT}"
LIMITS = FrontLimits(max_in_flight=16, per_caller_in_flight=4, retry_after_ms=50)
"""The component's arguments (docs/deploy.md says why these limits)."""
REGENERATE = (f"engram front-config --upstream {UPSTREAM} --listen {LISTEN} "
              f"--max-in-flight {LIMITS.max_in_flight} "
              f"--per-caller-in-flight {LIMITS.per_caller_in_flight} "
              f"--retry-after-ms {LIMITS.retry_after_ms} -o deploy/components/front/nginx.conf")
STATE_DIR = "/tmp"


@pytest.fixture(scope="module", params=FRONT_OVERLAYS)
def with_front(request: pytest.FixtureRequest) -> Rendered:
    return request.param, kustomize(request.param)


def _copy(rendered: Rendered) -> Rendered:
    return rendered[0], yaml.safe_load(yaml.safe_dump(rendered[1]))


def _pod(rendered: Rendered) -> dict[str, Any]:
    spec = _objects(rendered, "Deployment")["engram-shard"]["spec"]["template"]["spec"]
    return dict(spec)


def _named(pod: dict[str, Any], name: str) -> dict[str, Any]:
    containers = {c["name"]: c for c in pod["containers"]}
    assert name in containers, f"the shard's pod has no container {name!r}: {sorted(containers)}"
    return containers[name]  # type: ignore[no-any-return]


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container.get("ports", [])}


def _mounted_config(rendered: Rendered) -> tuple[str, str]:
    """(the path nginx's `-c` names, the text the ConfigMap mounted there holds)."""
    pod = _pod(rendered)
    front = _named(pod, FRONT)
    command = front["command"]
    assert command[0] == "nginx" and "-c" in command, f"the front container runs {command}"
    path = PurePosixPath(command[command.index("-c") + 1])
    mounts = {m["mountPath"]: m["name"] for m in front["volumeMounts"]}
    assert str(path.parent) in mounts, f"nothing is mounted where nginx reads {path}"
    volumes = {v["name"]: v for v in pod["volumes"]}
    volume = volumes[mounts[str(path.parent)]]
    assert "configMap" in volume, f"{path} is not from a ConfigMap: {volume}"
    config_maps = _objects(rendered, "ConfigMap")
    name = volume["configMap"]["name"]
    assert name in config_maps, f"the volume names ConfigMap {name}, which is not rendered"
    data = config_maps[name]["data"]
    assert path.name in data, f"ConfigMap {name} has no key {path.name}"
    return str(path), str(data[path.name])


DETAILS = re.compile(r'grpc-status-details-bin "([A-Za-z0-9+/]*)"')


def _canonical(text: str) -> tuple[str, Message, list[Message]]:
    """The configuration with the refusal's details decoded: (the text without them, the
    Status, its details). render() serialises ErrorInfo's metadata map in an order that
    changes from one process to the next (Python's string hashing), so two renderings of the
    same arguments can differ in those bytes and still mean the same."""
    found = DETAILS.findall(text)
    assert len(found) == 1, f"{len(found)} grpc-status-details-bin headers"
    raw = found[0]
    status = status_pb2.Status.FromString(base64.b64decode(raw + "=" * (-len(raw) % 4)))
    details: list[Message] = []
    for packed in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo):
            if packed.Is(kind.DESCRIPTOR):
                detail = kind()
                packed.Unpack(detail)
                details.append(detail)
    assert len(details) == len(status.details), status
    status.ClearField("details")
    return DETAILS.sub('grpc-status-details-bin "(details)"', text), status, details


def _address(config: str, directive: str) -> tuple[str, int]:
    found = re.findall(rf"^\s*{directive} (\S+):(\d+)\b", config, re.MULTILINE)
    assert len(found) == 1, f"the configuration has {len(found)} {directive} lines"
    host, port = found[0]
    return host, int(port)


def _check_wiring(rendered: Rendered) -> None:
    """The Service's grpc port goes to the proxy, and the proxy to the shard: its listen port
    is the container port `front`, its upstream the shard container's gRPC port on loopback;
    its pid and temporary files are on an emptyDir; the probe watches its port."""
    pod = _pod(rendered)
    shard, front = _named(pod, "shard"), _named(pod, FRONT)
    service = _objects(rendered, "Service")["engram-shard"]
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["port"] == GRPC_PORTS["shard"]
    assert grpc["targetPort"] == FRONT, (
        f"the engram-shard Service sends calls to {grpc['targetPort']!r}, around the proxy")
    assert _ports(front).get(FRONT) == FRONT_PORT, f"front's ports: {front.get('ports')}"
    assert FRONT not in _ports(shard), "the port `front` must be the proxy's alone"
    _, config = _mounted_config(rendered)
    assert _address(config, "listen")[1] == _ports(front)[FRONT], "nginx listens elsewhere"
    host, port = _address(config, "server")
    assert host in ("127.0.0.1", "[::1]", "localhost"), f"upstream {host}: not the pod itself"
    assert port == _ports(shard)["grpc"] == GRPC_PORTS["shard"], (
        f"the proxy passes calls to port {port}, not the shard container's gRPC port")
    probe = front["readinessProbe"]["tcpSocket"]["port"]
    assert probe in (FRONT, FRONT_PORT), f"the front readiness probe checks port {probe}"
    mounts = {m["mountPath"]: m["name"] for m in front["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    written = re.findall(r"^\s*(?:pid|\w+_temp_path) (\S+);", config, re.MULTILINE)
    assert len(written) == 6, written
    for path in written:
        parent = str(PurePosixPath(path).parent)
        assert parent in mounts and "emptyDir" in volumes[mounts[parent]], (
            f"nginx writes {path}, which is not on an emptyDir (the root file system is "
            f"read-only)")


def test_the_committed_configuration_is_the_generators() -> None:
    expected = render(UPSTREAM, LISTEN, LIMITS, state_dir=STATE_DIR)
    assert _canonical(CONFIG.read_text()) == _canonical(expected), (
        f"deploy/components/front/nginx.conf is not what engram front-config makes with the "
        f"component's arguments; regenerate it (from the repository root): {REGENERATE}")


def test_the_documented_command_makes_the_committed_configuration(tmp_path: Path) -> None:
    """The command in the component's kustomization.yaml is the one above, and it writes
    exactly the committed file."""
    documented = [line.lstrip("# ").strip()
                  for line in (COMPONENT / "kustomization.yaml").read_text().splitlines()
                  if line.lstrip("# ").startswith("engram front-config")]
    assert documented == [REGENERATE], "kustomization.yaml's regenerate command differs"
    args = shlex.split(REGENERATE)[1:]
    assert args[-2:] == ["-o", "deploy/components/front/nginx.conf"]
    out = tmp_path / "nginx.conf"
    result = CliRunner().invoke(app, [*args[:-1], str(out)])
    assert result.exit_code == 0, result.output
    assert _canonical(out.read_text()) == _canonical(CONFIG.read_text()), (
        f"regenerate it: {REGENERATE}")


def test_the_overlay_mounts_the_committed_configuration(with_front: Rendered) -> None:
    path, text = _mounted_config(with_front)
    assert path == "/etc/engram-front/nginx.conf"
    assert text == CONFIG.read_text()


def test_the_service_reaches_the_shard_through_the_proxy(with_front: Rendered) -> None:
    _check_wiring(with_front)


def _retarget_service(rendered: Rendered) -> None:
    service = _objects(rendered, "Service")["engram-shard"]
    service["spec"]["ports"][0]["targetPort"] = "grpc"


def _config_map(rendered: Rendered) -> dict[str, Any]:
    return next(o for o in rendered[1] if o["kind"] == "ConfigMap"
                and o["metadata"]["name"].startswith("engram-shard-front"))


def _edit_config(old: str, new: str) -> Any:
    def edit(rendered: Rendered) -> None:
        data = _config_map(rendered)["data"]
        assert old in data["nginx.conf"]
        data["nginx.conf"] = data["nginx.conf"].replace(old, new)
    return edit


def _edit_front(edit: Any) -> Any:
    def apply(rendered: Rendered) -> None:
        edit(_named(_pod(rendered), FRONT))
    return apply


def _unmount_tmp(front: dict[str, Any]) -> None:
    front["volumeMounts"] = [m for m in front["volumeMounts"] if m["mountPath"] != "/tmp"]


BREAKS = {
    "service targets the shard": _retarget_service,
    "upstream is another port": _edit_config("server 127.0.0.1:50051;", "server 127.0.0.1:50052;"),
    "upstream is another host": _edit_config("server 127.0.0.1:50051;",
                                             "server engram-shard:50051;"),
    "listens elsewhere": _edit_config("listen 0.0.0.0:50061", "listen 0.0.0.0:50062"),
    "port moved": _edit_front(lambda c: c["ports"][0].update(containerPort=50062)),
    "probe on the shard": _edit_front(
        lambda c: c["readinessProbe"]["tcpSocket"].update(port=50051)),
    "no config file": _edit_front(lambda c: c.update(command=["nginx"])),
    "no /tmp": _edit_front(_unmount_tmp),
}


@pytest.mark.parametrize("break_it", BREAKS.values(), ids=BREAKS.keys())
def test_the_wiring_check_fails_when_a_part_is_broken(with_front: Rendered,
                                                       break_it: Any) -> None:
    broken = _copy(with_front)
    break_it(broken)
    with pytest.raises(AssertionError):
        _check_wiring(broken)


def test_callers_reach_the_shard_only_through_the_proxy(with_front: Rendered) -> None:
    """The gateway, the compactor and clients are admitted on `front`; nobody on the shard's
    own port (the sidecar calls it over loopback, kubelet probes it from the node)."""
    allowed = _allowed(with_front)["shard"]
    assert {(caller, port) for caller, port in allowed if port != "metrics"} == {
        ("gateway", FRONT), ("compactor", FRONT), (CLIENT, FRONT)}


def test_the_proxy_drains_after_the_shards_pause(with_front: Rendered) -> None:
    """SIGTERM would stop nginx at once (fast shutdown) while the shard still drains: its
    preStop waits the shard's pause, quits gracefully and waits for nginx to exit."""
    pod = _pod(with_front)
    shard, front = _named(pod, "shard"), _named(pod, FRONT)
    pause = shard["lifecycle"]["preStop"]["sleep"]["seconds"]
    script = " ".join(front["lifecycle"]["preStop"]["exec"]["command"])
    path, config = _mounted_config(with_front)
    slept = re.search(r"\bsleep (\d+);", script)
    assert slept and int(slept.group(1)) >= pause, script
    assert f"-c {path} -s quit" in script, script
    pid = re.search(r"^pid (\S+);", config, re.MULTILINE)
    assert pid and f"[ -e {pid.group(1)} ]" in script, "it must wait for nginx to exit"
    assert pod["terminationGracePeriodSeconds"] > int(slept.group(1))


def test_the_image_is_an_official_nginx_pinned_by_version(with_front: Rendered) -> None:
    image = _named(_pod(with_front), FRONT)["image"]
    assert re.fullmatch(r"(nginx|nginxinc/nginx-unprivileged):\d+\.\d+\.\d+(-alpine)?"
                        r"(@sha256:[0-9a-f]{64})?", image), image


def test_nginx_accepts_the_mounted_configuration(with_front: Rendered, tmp_path: Path) -> None:
    """`nginx -t` on the ConfigMap's text, its state directory moved to a writable one."""
    _, text = _mounted_config(with_front)
    assert text.count(f" {STATE_DIR}/engram-front") == 6
    local = text.replace(f" {STATE_DIR}/engram-front", f" {tmp_path}/engram-front")
    checked = nginx_check(local, tmp_path)
    assert checked.returncode == 0, checked.stderr
    # The check can fail: a configuration cut short is refused.
    cut = nginx_check(local.rstrip().removesuffix("}"), tmp_path)
    assert cut.returncode != 0, "nginx -t accepted a configuration without its last brace"


def _check_plaintext(rendered: Rendered) -> None:
    """The proxy speaks plaintext HTTP/2 to its callers: a pod with it serves no TLS."""
    shard = _named(_pod(rendered), "shard")
    names = {e["name"] for e in shard.get("env", [])}
    for source in shard.get("envFrom", []):
        names |= set(_objects(rendered, "ConfigMap")[source["configMapRef"]["name"]]["data"])
    assert not any(n.startswith("ENGRAM_SHARD_TLS_") for n in names), (
        "components/front with components/tls: the proxy would have to terminate mutual TLS "
        "(not built)")


def test_overlays_with_the_proxy_are_plaintext_and_others_have_none(overlay: Rendered) -> None:
    containers = {c["name"] for c in _pod(overlay)["containers"]}
    if overlay[0] in FRONT_OVERLAYS:
        assert FRONT in containers
        _check_plaintext(overlay)
    else:
        assert FRONT not in containers
        assert not any(o["metadata"]["name"].startswith("engram-shard-front")
                       for o in overlay[1])


def test_the_component_adds_the_proxy_to_any_plaintext_overlay(tmp_path: Path) -> None:
    kustomize("dev")  # kubectl is there (or the test is skipped)
    rendered = ("dev+front", _with_components(tmp_path / "dev", "dev", ["front"]))
    _check_wiring(rendered)
    _check_plaintext(rendered)
    assert {o["metadata"].get("namespace") for o in rendered[1]
            if o["kind"] != "Namespace"} == {"engram-dev"}
    # dev's patch of containers/0 (small requests) still reaches the shard, not the proxy.
    pod = _pod(rendered)
    assert _named(pod, "shard")["resources"]["requests"]["cpu"] == "50m"
    assert _named(pod, FRONT)["resources"]["requests"]["cpu"] == "100m"
    # With components/tls the check refuses it.
    with_tls = ("prod-tls+front", _with_components(tmp_path / "tls", "prod-tls", ["front"]))
    with pytest.raises(AssertionError, match="terminate mutual TLS"):
        _check_plaintext(with_tls)
