"""A real gRPC server on 127.0.0.1:0 holding one fake servicer, for SDK and CLI tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

import engram.cli._output as cli_output

Serve = Callable[[Callable[[object, grpc.Server], None], object], str]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """``serve(add_XServicer_to_server, servicer)`` -> the address it listens on."""
    servers: list[grpc.Server] = []

    def start(register: Callable[[object, grpc.Server], None], servicer: object) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        register(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(0).wait()


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A token and an empty home for the CLI; each test sets the address it needs."""
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("ENGRAM_TOKEN", "test-token")
    monkeypatch.setattr(cli_output, "_settings", None)
