"""`engram up`: run the four services on this machine (SQLite + local files).

Creates the deployment's signing key and tokens under ``$ENGRAM_HOME/auth`` on
first use, starts each service as its own process (its own store, its own
environment: a service never sees another service's ``ENGRAM_<SVC>_*``
variables), waits until each reports SERVING, and stops them all cleanly on
Ctrl-C / SIGTERM or when any of them dies. Needs the server extra; the services'
dependencies are imported only when the command runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import typer
from rich.table import Table

from engram.cli._output import console, err_console, server_extra, settings
from engram.client._settings import DEFAULT_PORTS

ADMIN_AGENT = "admin"
DEFAULT_FLEET = "default"


@dataclass(frozen=True)
class ServiceLaunch:
    name: str
    port: int
    metrics_port: int
    needs: tuple[str, ...] = ()
    """Services whose address (ENGRAM_<SVC>_<DEP>_ADDR) and a service token it gets."""
    audience: tuple[str, ...] = ()
    """Services its token may call besides ``needs``, which `engram up` does not start (the
    shared embedding service: docs/embedder.md)."""
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def module(self) -> str:
        return f"services.{self.name}"

    @property
    def prefix(self) -> str:
        return f"ENGRAM_{self.name.upper()}_"


SERVICES = (
    ServiceLaunch("governance", DEFAULT_PORTS["governance"], 9102),
    # Every service polls governance for revoked tokens and suspended agents.
    ServiceLaunch("artifacts", DEFAULT_PORTS["artifacts"], 9103, needs=("governance",)),
    ServiceLaunch("shard", DEFAULT_PORTS["shard"], 9101, needs=("governance",),
                  audience=("embedder",)),
    ServiceLaunch("compactor", DEFAULT_PORTS["compactor"], 9104,
                  needs=("shard", "artifacts", "governance")),
)


def _audience(token: str) -> list[str]:
    """The services a token names (its signature is checked by ``needs_renewal``): a token
    minted before a service was added to what it may call is written again."""
    import jwt

    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return []
    aud = claims.get("aud", [])
    return sorted([aud] if isinstance(aud, str) else aud)


def prepare_home(home: Path) -> dict[str, Path]:
    """Key pair, the operator's admin token and one service token per service, each written
    again when missing, near its expiry or signed by an earlier signing key."""
    from services.common.auth import service_principal
    from services.common.tokens import (
        AUDIENCES,
        DEFAULT_SERVICE_TTL_SECONDS,
        TokenSigner,
        TokenVerifier,
        ensure_keypair,
        needs_renewal,
        write_token_file,
    )

    keys = ensure_keypair(home)
    signer = TokenSigner.load(keys.private)
    current = TokenVerifier.load(keys.public)

    def keep_fresh(path: Path, agent: str, fleet: str, roles: frozenset[str],
                   audience: tuple[str, ...]) -> Path:
        if (not path.exists() or needs_renewal(path.read_text().strip(), current)
                or _audience(path.read_text().strip()) != sorted(set(audience))):
            write_token_file(path, signer.issue(agent, fleet, roles, audience=audience,
                                                ttl_seconds=DEFAULT_SERVICE_TTL_SECONDS))
        return path

    tokens = {"admin": keep_fresh(home / "auth" / "admin.token", ADMIN_AGENT, DEFAULT_FLEET,
                                  frozenset({"admin", "governor"}), AUDIENCES)}
    for launch in SERVICES:
        tokens[launch.name] = keep_fresh(home / "auth" / f"{launch.name}.token",
                                         *service_principal(launch.name),
                                         launch.needs + launch.audience or (launch.name,))
    return tokens


ORDER = ("shard", "governance", "artifacts", "compactor")


def with_ports(base_port: int | None) -> tuple[ServiceLaunch, ...]:
    if base_port is None:
        return SERVICES
    return tuple(
        replace(
            s,
            port=base_port + ORDER.index(s.name),
            metrics_port=base_port + 10 + ORDER.index(s.name),
        )
        for s in SERVICES
    )


def write_endpoints(home: Path, host: str, launches: tuple[ServiceLaunch, ...]) -> None:
    """Where each service listens; the CLI reads it so it finds them with no set-up."""
    endpoints = {s.name: f"{host}:{s.port}" for s in launches}
    (home / "endpoints.json").write_text(json.dumps(endpoints, indent=2) + "\n")


def service_env(
    launch: ServiceLaunch, home: Path, host: str, launches: tuple[ServiceLaunch, ...] = SERVICES
) -> dict[str, str]:
    others = tuple(f"ENGRAM_{s.name.upper()}_" for s in SERVICES if s.name != launch.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(others)}
    env.update(
        ENGRAM_HOME=str(home),
        PYTHONUNBUFFERED="1",
        **{
            f"{launch.prefix}HOST": host,
            f"{launch.prefix}PORT": str(launch.port),
            f"{launch.prefix}METRICS_PORT": str(launch.metrics_port),
            f"{launch.prefix}SERVICE_TOKEN_FILE": str(home / "auth" / f"{launch.name}.token"),
        },
    )
    for dep in launch.needs:
        port = next(s.port for s in launches if s.name == dep)
        env[f"{launch.prefix}{dep.upper()}_ADDR"] = f"{host}:{port}"
    env.update(launch.extra_env)
    return env


def wait_serving(address: str, process: subprocess.Popen[bytes], deadline: float) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    return False


def up(
    host: str = typer.Option("127.0.0.1", help="address the services listen on"),
    startup_timeout: float = typer.Option(120.0, help="seconds to wait for each service"),
    only: list[str] = typer.Option(
        [], "--only", help="run just these services (repeatable), e.g. --only shard"
    ),
    base_port: int | None = typer.Option(
        None,
        help="gRPC ports base, base+1.. in the order shard, governance, artifacts, "
        "compactor (metrics on base+10..); default 50051.. and 9101..",
    ),
) -> None:
    """Run all services in the foreground; Ctrl-C or SIGTERM stops them cleanly."""
    with server_extra("up"):
        _run_services(host, startup_timeout, only, base_port)


def _run_services(host: str, startup_timeout: float, only: list[str],
                  base_port: int | None) -> None:
    home = settings().home.resolve()
    tokens = prepare_home(home)
    launches = with_ports(base_port)
    processes: list[tuple[ServiceLaunch, subprocess.Popen[bytes]]] = []
    stopping = False

    def stop_all(*_args: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    table = Table(title=f"Engram on {host} (data in {home})")
    for column in ("service", "address", "metrics", "pid"):
        table.add_column(column)
    try:
        write_endpoints(home, host, launches)
        unknown = set(only) - {s.name for s in SERVICES}
        if unknown:
            raise RuntimeError(
                f"unknown service(s) {sorted(unknown)}; choose from {[s.name for s in SERVICES]}"
            )
        for launch in launches:
            if only and launch.name not in only:
                continue
            if importlib.util.find_spec(launch.module) is None:
                err_console.print(f"[yellow]skipping {launch.name}: not installed[/yellow]")
                continue
            log_path = home / "logs" / f"{launch.name}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = log_path.open("ab")
            process = subprocess.Popen(
                [sys.executable, "-m", launch.module],
                env=service_env(launch, home, host, launches),
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
            processes.append((launch, process))
            address = f"{host}:{launch.port}"
            if not wait_serving(address, process, time.monotonic() + startup_timeout):
                raise RuntimeError(f"{launch.name} did not become SERVING; see {log_path}")
            table.add_row(
                launch.name,
                address,
                f"http://{host}:{launch.metrics_port}/metrics",
                str(process.pid),
            )
        console.print(table)
        console.print(f"admin token: {tokens['admin']}  (the CLI uses it by default)")
        console.print("Ctrl-C stops everything.")
        while not stopping:
            for launch, process in processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{launch.name} exited with {process.returncode}; "
                        f"see {home / 'logs' / (launch.name + '.log')}"
                    )
            time.sleep(0.5)
    except RuntimeError as error:
        err_console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    finally:
        _terminate(processes)
    console.print("all services stopped")


def _terminate(processes: list[tuple[ServiceLaunch, subprocess.Popen[bytes]]]) -> None:
    for _launch, process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for _launch, process in reversed(processes):
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
