"""Governance, a gated shard and artifacts as real servers on 127.0.0.1:0, and `engram mcp`
in front of them as a subprocess, driven by the mcp SDK's own client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TokenFactory
from tests.stack import gated_stack

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Stack:
    governance_addr: str
    shard_addr: str
    artifacts_addr: str
    home: Path
    tokens: TokenFactory

    def env(self, token: str | None = None) -> dict[str, str]:
        """What `engram mcp` needs: where the services are, and for stdio its token."""
        env = {"PYTHONPATH": str(ROOT), "ENGRAM_HOME": str(self.home),
               "ENGRAM_SHARD_ADDR": self.shard_addr, "ENGRAM_ARTIFACTS_ADDR": self.artifacts_addr}
        if token is not None:
            env["ENGRAM_TOKEN"] = token
        return env


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory, engram_home: Path,
          make_token: TokenFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("mcp-stack")
    # An empty home: the MCP server must not find an admin token or endpoints there.
    home = data / "mcp-home"
    home.mkdir()
    with gated_stack(data, engram_home, make_token) as servers:
        yield Stack(servers.governance.address, servers.shard.address,
                    servers.artifacts.address, home, make_token)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="package")
def http_url(stack: Stack) -> Iterator[str]:
    """`engram mcp --transport http`, started with a valid token of its own in ENGRAM_TOKEN:
    requests without a bearer token must still fail (no fallback to the server's token)."""
    with mcp_over_http(stack) as server:
        yield server.url


@dataclass
class McpHttp:
    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def mcp_over_http(stack: Stack, *args: str) -> Iterator[McpHttp]:
    """`engram mcp --transport http` with ``args``, running until the block ends."""
    port = _free_port()
    env = {**os.environ, **stack.env(stack.tokens("server-owner", "fleet-a", ("governor",)))}
    log = stack.home / f"mcp-http-{port}.log"  # a file, not a pipe nobody drains
    with log.open("w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "engram.cli.main", "mcp", "--transport", "http", "--port",
             str(port), *args], env=env, cwd=stack.home, stdout=subprocess.DEVNULL,
            stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"did not listen: {log.read_text()}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield McpHttp(f"http://127.0.0.1:{port}/mcp", server)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
