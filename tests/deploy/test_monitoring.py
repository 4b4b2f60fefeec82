"""deploy/monitoring: the alerts and the dashboard render, and read only metrics that exist.

The metric names are taken from the services themselves: each server is built (not started)
on a scratch SQLite store and its /metrics registry is collected, so a renamed metric or a
typo in a query fails here rather than in an operator's empty graph.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.artifacts.server import build_artifacts_server
from services.artifacts.settings import ArtifactsSettings
from services.compactor.server import build_compactor_server
from services.compactor.settings import CompactorSettings
from services.embedder.server import build_embedder_server
from services.embedder.settings import EmbedderSettings
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_ALERTS = {"EngramErrorRatioHigh", "EngramLatencyP99High", "EngramIndexLagHigh",
                   "EngramIntegrityFailure", "EngramGovernanceUnreachable"}
EMBEDDER_ALERTS = {"EngramEmbedderDown", "EngramEmbedderUnreachable",
                   "EngramEmbedderLatencyP99High", "EngramShardEmbedderFailing"}
EMBEDDER_FAILURES = "engram_shard_embedder_failures_total"
EMBEDDER_SERVICE = "engram.embedder.v1.EmbedderService"
_NAME = re.compile(r"\b((?:engram|grpc_server)_[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    require(kubectl is not None, "kubectl is not installed: it renders the kustomizations")
    result = subprocess.run([str(kubectl), "kustomize", str(ROOT / "deploy" / "monitoring")],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name the five services' registries can export (the embedder's too)."""
    from services.common.tokens import ensure_keypair

    data = tmp_path_factory.mktemp("metrics")
    ensure_keypair(data)  # the home's signing key, as `engram up` makes it
    token = data / "svc.token"
    token.write_text("unused: the servers are built, never started")
    registries = [
        build_governance_server(GovernanceSettings(
            home=data, port=0, db_url=f"sqlite:///{data / 'g.db'}")).spec.registry,
        build_shard_server(ShardSettings(home=data, port=0, db_url=f"sqlite:///{data / 's.db'}",
                                         embedder="none", allow_ungated=True))[0].spec.registry,
        build_artifacts_server(ArtifactsSettings(
            home=data, port=0, db_url=f"sqlite:///{data / 'a.db'}",
            blob_url=(data / "blobs").as_uri()))[0].spec.registry,
        build_compactor_server(CompactorSettings(
            home=data, port=0, db_url=f"sqlite:///{data / 'c.db'}",
            blob_url=(data / "cblobs").as_uri(), service_token_file=token)).spec.registry,
        build_embedder_server(EmbedderSettings(
            home=data, port=0, embedder="hash", allow_test_embedder=True)).spec.registry,
    ]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                        "summary": ("_sum", "_count")}.get(family.type, ("",))
            names |= {family.name + suffix for suffix in suffixes}
    return names


def _by_kind(rendered: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in rendered if doc["kind"] == kind]


def test_the_alerts_an_operator_needs_are_complete(rendered: list[dict[str, Any]]) -> None:
    (rule,) = _by_kind(rendered, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "engram"
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert {a["alert"] for a in alerts} >= REQUIRED_ALERTS
    for alert in alerts:
        assert alert["expr"].strip() and alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert alert["expr"].count("(") == alert["expr"].count(")"), alert["alert"]


def test_the_dashboard_is_a_grafana_config_map(rendered: list[dict[str, Any]]) -> None:
    (config_map,) = _by_kind(rendered, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["engram-dashboard.json"])
    assert dashboard["uid"] == "engram-overview" and len(dashboard["panels"]) >= 10
    for panel in dashboard["panels"]:
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])


def test_every_query_reads_a_metric_the_services_export(
    rendered: list[dict[str, Any]], exported: set[str]
) -> None:
    (rule,) = _by_kind(rendered, "PrometheusRule")
    (config_map,) = _by_kind(rendered, "ConfigMap")
    dashboard = json.loads(config_map["data"]["engram-dashboard.json"])
    queries = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    queries += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for query in queries for name in _NAME.findall(query)}
    assert used, "no metric found in the queries"
    assert used <= exported, f"not exported by any service: {sorted(used - exported)}"


def test_the_embedder_has_its_alerts_and_they_need_it_deployed(
    rendered: list[dict[str, Any]],
) -> None:
    (rule,) = _by_kind(rendered, "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    missing = EMBEDDER_ALERTS - alerts.keys()
    assert not missing, f"embedder alerts missing: {sorted(missing)}"
    down = alerts["EngramEmbedderDown"]["expr"]
    # optional service: absent() would fire in every stack without it
    assert "absent(" not in down and "up{" in down and "embedder" in down and "== 0" in down
    assert "EMBEDDER_UNAVAILABLE" in alerts["EngramEmbedderUnreachable"]["expr"]
    latency = alerts["EngramEmbedderLatencyP99High"]["expr"]
    assert EMBEDDER_SERVICE in latency and 'grpc_method="Embed"' in latency
    # the generic 500 ms p99 alert leaves Embed (seconds-long indexing batches) to its own
    assert 'grpc_method!="Embed"' in alerts["EngramLatencyP99High"]["expr"]
    assert "EngramIndexLagHigh" in alerts
    # the failures a search or the indexer absorbs (answered lexically, retried), by stage
    failing = alerts["EngramShardEmbedderFailing"]
    assert EMBEDDER_FAILURES in failing["expr"] and "stage" in failing["expr"]
    assert "rate(" in failing["expr"] and "> 0" in failing["expr"] and failing["for"]


def test_the_dashboard_has_an_embedder_row(rendered: list[dict[str, Any]]) -> None:
    (config_map,) = _by_kind(rendered, "ConfigMap")
    dashboard = json.loads(config_map["data"]["engram-dashboard.json"])
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    assert any(p["type"] == "row" and "Embedder" in p["title"] for p in dashboard["panels"])
    for needed in (EMBEDDER_SERVICE, "engram_embedder_texts_total",
                   "engram_embedder_seconds_total", "histogram_quantile(0.99",
                   EMBEDDER_FAILURES):
        assert needed in exprs, needed
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_every_process_is_watched_for_memory_cpu_and_file_descriptors(
        rendered: list[dict[str, Any]]) -> None:
    """Services export process_* (prometheus-client's process collector, in every registry):
    the dashboard shows RSS, CPU and file descriptors by pod, and an alert fires before the
    descriptors run out (each stream, connection and open blob holds one)."""
    (config_map,) = _by_kind(rendered, "ConfigMap")
    dashboard = json.loads(config_map["data"]["engram-dashboard.json"])
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    for needed in ("process_resident_memory_bytes", "process_cpu_seconds_total",
                   "process_open_fds / process_max_fds"):
        assert needed in exprs, needed
    (rule,) = _by_kind(rendered, "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    fds = alerts["EngramFileDescriptorsNearLimit"]
    assert "process_open_fds / process_max_fds" in fds["expr"] and fds["for"]
