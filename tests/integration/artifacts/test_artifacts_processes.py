"""Multi-process: moto_server (S3), `python -m services.artifacts`, and the `engram` CLI groups."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
CLI = ("import typer; from engram.cli.artifacts import register; "
       "app = typer.Typer(pretty_exceptions_enable=False); register(app); app()")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(check: Callable[[], bool], process: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up")


ARTIFACTS_SERVICE = "engram.artifacts.v1.ArtifactsService"


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            # By the service's own name: another test's server that took the port answers ""
            # SERVING too (tests/unit/bench/test_server_process.py), but not this name.
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=ARTIFACTS_SERVICE), timeout=1)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def test_cli_against_service_process_with_s3_blobs(
        moto_endpoint: str, engram_home: Path, make_token: Callable[..., str],
        tmp_path: Path) -> None:
    creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                 aws_access_key_id="test", aws_secret_access_key="test").create_bucket(
        Bucket="engram-blobs")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(creds, ENGRAM_HOME=str(engram_home), ENGRAM_ARTIFACTS_PORT=str(port),
               ENGRAM_ARTIFACTS_DB_URL=f"sqlite:///{tmp_path / 'artifacts.db'}",
               ENGRAM_ARTIFACTS_BLOB_URL="s3://engram-blobs/engram",
               ENGRAM_ARTIFACTS_S3_ENDPOINT_URL=moto_endpoint,
               ENGRAM_ARTIFACTS_S3_REGION="us-east-1")
    service = subprocess.Popen([sys.executable, "-m", "services.artifacts"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    cli_env.update(ENGRAM_HOME=str(engram_home), ENGRAM_ARTIFACTS_ADDR=f"127.0.0.1:{port}",
                   ENGRAM_TOKEN=make_token("agent-cli", "fleet-cli"))

    def cli(*args: str, ok: bool = True) -> dict[str, object] | list[object]:
        done = subprocess.run([sys.executable, "-c", CLI, *args, "--json"], cwd=ROOT,
                              env=cli_env, capture_output=True, text=True, timeout=120)
        assert (done.returncode == 0) == ok, done.stderr + done.stdout
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    try:
        _wait(lambda: _serving(f"127.0.0.1:{port}"), service, "artifacts service")
        run_id = cli("runs", "start", "cli-run")["run_id"]
        source = tmp_path / "data.bin"
        source.write_bytes(os.urandom(6 * 1024 * 1024 + 3))
        stored = cli("artifacts", "put", str(source), "--run", "cli-run", "--step", "s1",
                     "--meta", '{"k": 1}')
        assert isinstance(stored, dict)
        artifact_id = stored["artifact_id"]
        assert stored["path"] == f"fleets/fleet-cli/runs/cli-run/s1/{artifact_id}/data.bin"
        out = tmp_path / "back.bin"
        cli("artifacts", "get", str(stored["artifact_id"]), "-o", str(out))
        assert out.read_bytes() == source.read_bytes()
        listed = cli("artifacts", "ls", "--run", "cli-run")
        assert [a["artifact_id"] for a in listed] == [stored["artifact_id"]]  # type: ignore[index]
        manifest = cli("manifests", "put", '{"window": ["c1"]}', "--run", "cli-run")
        event = cli("events", "append", "cli-run", "tool.called", '{"tool": "search"}',
                    "--manifest", str(manifest["manifest_id"]))
        assert event["seq"] == 1  # int64 as a number, not proto JSON's string
        snapshot = cli("snapshots", "put", "cli-run", '{"step": 1}', "--artifact",
                       str(stored["artifact_id"]), "--request-id", "snap-1")
        assert cli("snapshots", "put", "cli-run", '{"step": 1}', "--artifact",
                   str(stored["artifact_id"]), "--request-id", "snap-1") == snapshot
        cli("events", "append", "cli-run", "tool.done", "{}")
        view = cli("rehydrate", "cli-run")
        assert [e["seq"] for e in view["events"]] == [2]  # type: ignore[index]
        assert cli("events", "ls", "cli-run")[0]["type"] == "tool.called"  # type: ignore[index]
        assert cli("events", "verify", "cli-run")["intact"] is True
        evidence = cli("evidence", "add", "corp", "idx", "chunk-1", "0", "10")
        assert cli("evidence", "get", str(evidence["evidence_id"]))["chunk_id"] == "chunk-1"
        assert cli("manifests", "get", str(manifest["manifest_id"]))["run_id"] == "cli-run"
        assert cli("artifacts", "verify", "--run", "cli-run")["problems"] == []
        boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                     aws_access_key_id="test", aws_secret_access_key="test").delete_object(
            Bucket="engram-blobs", Key=f"engram/{stored['path']}")
        report = cli("artifacts", "verify", "--run", "cli-run", ok=False)
        assert [p["problem"] for p in report["problems"]] == ["BLOB_MISSING"]  # type: ignore[index]
        failed = cli("runs", "resolve", "cli-run", "artifact", str(stored["artifact_id"]),
                     ok=False)
        assert failed["error"]["reason"] == "CRITICAL_POINTER_UNRESOLVED"  # type: ignore[index]
        assert cli("runs", "status", "cli-run")["status"] == "RUN_STATUS_SYSTEM_ERROR"
        assert run_id == "cli-run"
    finally:
        service.terminate()
        _out, err = service.communicate(timeout=30)
    assert service.returncode == 0, err.decode()[-2000:]
