"""Every service's /metrics carries its domain metrics, and a tour moves them.

The four services run in this process with a metrics port each; a tour writes records (one
denied by a rule, one retried), verifies, searches, uploads and reads an artifact, records
enough iterations to seal a warm segment, verifies the run, and makes calls that are refused
(a bad argument, a rate limit). Each /metrics is scraped over HTTP before and after.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engram.client import (
    ArtifactsClient,
    CompactorClient,
    EngramRpcError,
    GovernanceClient,
    ShardClient,
)
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.common.stack import running_stack


def _settings(service: str) -> dict[str, Any]:
    common: dict[str, Any] = {"metrics_port": 0}
    if service == "shard":
        common["embedder"] = "none"
    if service == "compactor":
        common["rotate_bytes"] = 256  # a segment seals after a few iterations
    if service == "artifacts":  # reads: 2 at once, then 1 a second
        common.update(rate_limit_reads=1.0, rate_limit_read_burst=2)
    return common


def scrape(port: int | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    """The sum over samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in metrics.items()
               if n == name and set(labels.items()) <= set(ls))


def test_a_tour_moves_every_domain_metric(tmp_path: Path, engram_home: Path,
                                          make_token: TokenFactory) -> None:
    with running_stack(tmp_path, engram_home, make_token, settings=_settings) as stack:
        ports = {name: server.metrics_port for name, server in stack.servers.items()}
        before = {name: scrape(port) for name, port in ports.items()}
        agent = make_token("agent-m", "fleet-m")
        governor = make_token("gov-m", "fleet-m", ("governor",))
        with GovernanceClient(stack.address("governance"), governor) as gov:
            gov.add_rule(gpb.Rule(deny_pattern=gpb.DenyPattern(pattern="forbidden")))
        with ShardClient(stack.address("shard"), agent) as shard:
            shard.add("the deploy takes ten minutes", run_id="run-m", request_id="r1")
            shard.add("the deploy takes ten minutes", run_id="run-m", request_id="r1")  # retry
            with pytest.raises(EngramRpcError):
                shard.add("a forbidden fact", run_id="run-m")
            with pytest.raises(EngramRpcError):
                shard.get("no such id")
            assert not shard.verify(all_records=True).failures
            shard.search("deploy")
        with ShardClient(stack.address("shard"), governor) as shard, \
                GovernanceClient(stack.address("governance"), governor) as gov:
            listed = shard.forget(match="ten minutes").records
            erasure = gov.record_erasure("match", "", [gpb.ErasedItem(
                kind=r.kind, id=r.record_id, leaf_hash=r.record_hash) for r in listed]).erasure
            assert shard.forget(erasure_id=erasure.erasure_id).records
        with ArtifactsClient(stack.address("artifacts"), agent) as art:
            art.start_run("run-m")
            stored = art.upload([b"x" * 5000], run_id="run-m", step_id="s", name="a.bin")
            art.max_retries = 0
            refused = 0
            for _ in range(6):  # past the read burst of 2
                try:
                    _, chunks = art.read(stored.artifact_id)
                    assert b"".join(chunks) == b"x" * 5000
                except EngramRpcError as error:
                    assert error.reason == "RATE_LIMITED", error
                    refused += 1
            assert refused
        with CompactorClient(stack.address("compactor"), agent) as comp:
            for n in range(1, 9):
                comp.record("run-m", cpb.IterationInput(iteration=n, plan_digest=f"p{n}",
                                                        status="ok", detail_json="{}"))
            assert comp.verify("run-m").ok
        after = {name: scrape(port) for name, port in ports.items()}
    # every service's own process: memory, CPU, file descriptors (the dashboard's Processes row)
    for name, metrics in after.items():
        assert value(metrics, "process_resident_memory_bytes") > 10_000_000, name
        assert value(metrics, "process_open_fds") > 0, name
        assert value(metrics, "process_max_fds") > 0, name
        assert "process_cpu_seconds_total" in {key[0] for key in metrics}, name

    def moved(service: str, name: str, by: float = 1, **labels: str) -> None:
        delta = value(after[service], name, **labels) - value(before[service], name, **labels)
        assert delta >= by, f"{service} {name}{labels}: moved by {delta}, expected >= {by}"

    moved("shard", "engram_shard_records_written_total")
    moved("shard", "engram_shard_gate_calls_total", kind="single")
    moved("shard", "engram_shard_gate_requests_total", by=2)
    moved("shard", "engram_shard_records_erased_total", kind="record")
    assert ("engram_shard_index_lag_records", ()) in after["shard"]
    assert ("engram_shard_index_lag_seconds", ()) in after["shard"]
    assert ("engram_shard_embedder_queue_records", ()) in after["shard"]
    moved("shard", "engram_rpc_errors_total", by=2)
    moved("shard", "engram_rpc_errors_total", code="PERMISSION_DENIED")
    moved("governance", "engram_gate_decisions_total", outcome="allowed")
    moved("governance", "engram_gate_decisions_total", outcome="denied", rule="deny_pattern")
    assert value(after["governance"], "engram_governance_chain_intact") == 1
    moved("artifacts", "engram_artifacts_blob_bytes_total", by=5000, direction="in")
    moved("artifacts", "engram_artifacts_blob_bytes_total", by=5000, direction="out")
    moved("artifacts", "engram_rpc_errors_total", reason="RATE_LIMITED")
    moved("compactor", "engram_compactor_sealed_segments_total")
    moved("compactor", "engram_compactor_sealed_bytes_total", by=256)
    for service in ("shard", "artifacts", "compactor", "governance"):
        assert value(after[service], "engram_integrity_failures_total") == 0
