"""Fault tests: the real services, each its own process on 127.0.0.1, as `engram up` runs them.

``ENGRAM_SOAK=1`` (``make soak``) selects the long variant of each test; the default is the
short one that ``make test`` runs. Each test says its pass criterion in its docstring.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram.bench._harness import ServerProcess, free_port
from engram.client import EngramRpcError, ShardClient
from services.common.tokens import TokenSigner, ensure_keypair, write_token_file

SOAK = os.environ.get("ENGRAM_SOAK") == "1"
SERVICES = ("governance", "artifacts", "shard", "compactor")


def scale(short: int, long: int) -> int:
    """``short`` in `make test`, ``long`` under ENGRAM_SOAK=1 (`make soak`)."""
    return long if SOAK else short


def health(address: str, timeout: float = 1.0) -> int | None:
    """The health status (1 SERVING, 2 NOT_SERVING), or None when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        try:
            return int(health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout).status)
        except grpc.RpcError:
            return None


@dataclass
class Stack:
    """The four services under one home; each can be stopped, killed and started again on
    the same port and store."""

    home: Path
    signer: TokenSigner
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, ServerProcess] = field(default_factory=dict)
    extra: dict[str, dict[str, str]] = field(default_factory=dict)

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def db_path(self, name: str) -> Path:
        return self.home / name / f"{name}.db"

    def env(self, name: str) -> dict[str, str]:
        prefix = f"ENGRAM_{name.upper()}_"
        env = {"ENGRAM_HOME": str(self.home), "ENGRAM_LOG_LEVEL": "WARNING",
               "PYTHONUNBUFFERED": "1",
               f"{prefix}DB_URL": f"sqlite:///{self.db_path(name)}",
               f"{prefix}SERVICE_TOKEN_FILE": str(self.home / "auth" / f"{name}.token")}
        if name == "artifacts":
            env["ENGRAM_ARTIFACTS_BLOB_URL"] = (self.home / "artifacts" / "blobs").as_uri()
        if name == "shard":
            env["ENGRAM_SHARD_GOVERNANCE_ADDR"] = self.address("governance")
            env["ENGRAM_SHARD_EMBEDDER"] = "none"
        if name == "compactor":
            env["ENGRAM_COMPACTOR_SHARD_ADDR"] = self.address("shard")
            env["ENGRAM_COMPACTOR_BLOB_URL"] = (self.home / "compactor" / "blobs").as_uri()
        env.update(self.extra.get(name, {}))
        return env

    def _process(self, name: str) -> ServerProcess:
        (self.home / name).mkdir(exist_ok=True)
        port = self.ports.setdefault(name, free_port())
        process = ServerProcess([sys.executable, "-m", f"services.{name}"], self.env(name),
                                port=port, port_env=f"ENGRAM_{name.upper()}_PORT", timeout=120,
                                log_path=self.home / name / "service.log",
                                health_service=f"engram.{name}.v1.{name.title()}Service")
        # A service never sees another service's ENGRAM_<SVC>_* variables (as `engram up`).
        others = tuple(f"ENGRAM_{s.upper()}_" for s in SERVICES if s != name)
        process._env = {k: v for k, v in process._env.items() if not k.startswith(others)}
        return process

    def start(self, name: str) -> float:
        """Start ``name`` and wait for SERVING; the seconds that took. A first start whose
        port another process took meanwhile (ports are picked free, then bound later, and
        tests run in parallel) is made again on another port."""
        began = time.monotonic()
        first = name not in self.processes
        process = self._process(name)
        try:
            process.__enter__()
        except RuntimeError:
            if not first or "address already in use" not in self.log(name).lower():
                raise
            self.ports[name] = free_port()
            process = self._process(name)
            process.__enter__()
        self.processes[name] = process
        return time.monotonic() - began

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``name`` without waiting for SERVING (a service that may refuse to serve)."""
        process = self._process(name)
        log = (self.home / name / "service.log").open("ab")
        try:
            popen = subprocess.Popen(process._argv, env=process._env,
                                     stdout=subprocess.DEVNULL, stderr=log)
        finally:
            log.close()
        process.process = popen
        self.processes[name] = process
        return popen

    def popen(self, name: str) -> subprocess.Popen[bytes]:
        process = self.processes[name].process
        assert process is not None
        return process

    def kill(self, name: str) -> None:
        process = self.popen(name)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self, name: str) -> int:
        """SIGTERM and wait; the exit code."""
        process = self.popen(name)
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return int(process.returncode)

    def stop_all(self) -> None:
        for name in reversed(SERVICES):
            if name in self.processes:
                self.stop(name)

    def log(self, name: str) -> str:
        path = self.home / name / "service.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def token(self, agent: str = "agent-1", fleet: str = "fleet-f",
              roles: tuple[str, ...] = ("agent",)) -> str:
        return self.signer.issue(agent, fleet, set(roles))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """An empty stack (nothing started); every service still running is stopped afterwards."""
    keys = ensure_keypair(tmp_path)
    signer = TokenSigner.load(keys.private)
    for name in SERVICES:
        write_token_file(tmp_path / "auth" / f"{name}.token",
                         signer.issue(f"svc-{name}", "system", {"service"}))
    built = Stack(tmp_path, signer)
    try:
        yield built
    finally:
        built.stop_all()


# A client that saw the server die reconnects quickly (the default backoff grows to minutes).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 500)]


def shard_client(stack: Stack, agent: str, timeout: float = 5.0) -> ShardClient:
    channel = grpc.insecure_channel(stack.address("shard"), options=CHANNEL_OPTIONS)
    return ShardClient(stack.address("shard"), stack.token(agent), timeout=timeout,
                       channel=channel)


@dataclass
class Writer:
    """Writes without pause into its own run, each write with its own request_id; a failed
    write is retried with the same request_id until it is acknowledged."""

    index: int
    stack: Stack
    stop: threading.Event
    run_prefix: str
    acked: list[tuple[str, str, str]] = field(default_factory=list)  # (id, request_id, content)
    failures: int = 0
    unexpected: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return f"{self.run_prefix}-{self.index}"

    def loop(self) -> None:
        with shard_client(self.stack, f"writer-{self.index}") as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                request_id = f"w{self.index}-{n}"
                content = f"writer {self.index} fact {n}: the cache key is {random.random()}"
                while not self.stop.is_set():
                    try:
                        reply = client.add(content, run_id=self.run_id, request_id=request_id)
                    except EngramRpcError as error:
                        self.failures += 1
                        if error.code not in (grpc.StatusCode.UNAVAILABLE,
                                              grpc.StatusCode.DEADLINE_EXCEEDED,
                                              grpc.StatusCode.CANCELLED):
                            self.unexpected.append(f"{error.code.name}: {error}")
                        time.sleep(0.05)
                        continue
                    self.acked.append((reply.record.id, request_id, content))
                    break


def first_write_after_serving(stack: Stack, cycle: int) -> float:
    """Seconds from now (a service just reported SERVING) to the first shard write that
    succeeds, on a fresh channel."""
    began = time.monotonic()
    with shard_client(stack, "prober", timeout=2.0) as client:
        attempt = 0
        while time.monotonic() - began < 30:
            attempt += 1
            try:
                client.add(f"probe {cycle}.{attempt}", run_id="probe",
                           request_id=f"probe-{cycle}-{attempt}")
                return time.monotonic() - began
            except EngramRpcError:
                time.sleep(0.02)
    return float("inf")
