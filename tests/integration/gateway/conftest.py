"""The four services as real servers on 127.0.0.1:0 (governance gating the shard, the
compactor reaching the shard with a service token), and the gateway on port 0 in front of
them, served by uvicorn in a thread of the test process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")

from engram.gateway import Gateway, GatewayConfig  # noqa: E402
from engram.gateway._http import DEFAULT_HEADER_TIMEOUT, header_timed  # noqa: E402
from services.common.tokens import write_token_file  # noqa: E402
from services.compactor.server import build_compactor_server  # noqa: E402
from services.compactor.settings import CompactorSettings  # noqa: E402
from tests.conftest import TokenFactory  # noqa: E402
from tests.stack import gated_stack  # noqa: E402


@dataclass(frozen=True)
class Stack:
    addresses: dict[str, str]
    tokens: TokenFactory


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory, engram_home: Path,
          make_token: TokenFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("gateway-stack")
    with gated_stack(data, engram_home, make_token) as servers:
        compactor_token = data / "compactor.token"
        write_token_file(compactor_token, make_token("svc-compactor", "system", ("service",)))
        compactor = build_compactor_server(CompactorSettings(
            home=engram_home, port=0, db_url=f"sqlite:///{data / 'compactor.db'}",
            blob_url=(data / "cold").resolve().as_uri(), shard_addr=servers.shard.address,
            service_token_file=compactor_token)).start()
        try:
            yield Stack({"shard": servers.shard.address,
                         "governance": servers.governance.address,
                         "artifacts": servers.artifacts.address,
                         "compactor": compactor.address}, make_token)
        finally:
            compactor.stop(0)


class GatewayThread:
    """uvicorn serving the gateway app on a socket bound to port 0, in a daemon thread, with
    the protocol ``engram gateway`` serves with (its header timeout)."""

    def __init__(self, gateway: Gateway, header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(gateway.app(), log_level="error",
                                                    lifespan="on",
                                                    http=header_timed(header_timeout)))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="package")
def gateway_url(stack: Stack) -> Iterator[str]:
    with GatewayThread(Gateway(GatewayConfig(addresses=stack.addresses,
                                             timeout_seconds=10.0))) as url:
        yield url
