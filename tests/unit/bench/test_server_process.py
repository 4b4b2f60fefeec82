"""The harness that starts servers for benches and fault tests."""

from __future__ import annotations

import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from engram.bench._harness import ServerProcess


def test_a_server_that_never_serves_is_stopped_not_left_running(tmp_path: Path) -> None:
    # A restarted governance whose chain check failed never reports SERVING: the fault test
    # that started it used to leave it running (a ResourceWarning in a later test).
    never = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], {},
                          timeout=1, log_path=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="did not become SERVING in 1"):
        never.__enter__()
    assert never.process is not None and never.process.poll() is not None


def test_another_server_on_the_port_is_not_taken_for_the_one_started(tmp_path: Path) -> None:
    # Ports are picked free and bound later; a parallel test's server took one, answered the
    # health check for "" with SERVING, and the fault test then talked to it: UNIMPLEMENTED.
    other = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, other)
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        mine = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], {},
                             port=port, timeout=1, log_path=tmp_path / "server.log",
                             health_service="engram.shard.v1.ShardService")
        with pytest.raises(RuntimeError, match="did not become SERVING"):
            mine.__enter__()
    finally:
        other.stop(0)
