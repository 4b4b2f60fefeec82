"""One function assembles a service's gRPC server, so tests start what production runs.

``build_server(settings, spec)`` wires interceptors (metrics, logging, errors,
auth), the standard ``grpc.health.v1`` servicer, reflection, optional TLS/mTLS,
an optional plaintext health-only port (``health_port``: probes that cannot speak
TLS) and the ``/metrics`` endpoint. :meth:`EngramServer.stop` flips health to
NOT_SERVING before draining in-flight calls for ``grace_seconds``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from services.common.access import AccessRestrictions
from services.common.auth import Authorizer, MethodPolicy
from services.common.interceptors import (
    AuthInterceptor,
    ErrorInterceptor,
    LoggingInterceptor,
    MetricsInterceptor,
)
from services.common.metrics import GrpcMetrics, serve_metrics
from services.common.settings import ServerSettings
from services.common.tokens import TokenVerifier, load_public_keys

log = logging.getLogger("engram.server")


@dataclass
class ServiceSpec:
    """What a service contributes to the shared wiring."""

    name: str
    """Short name (``shard``), used in logs and metrics."""
    full_names: Sequence[str]
    """Fully-qualified gRPC service names (``engram.shard.v1.ShardService``)."""
    register: Callable[[grpc.Server], None]
    policy: MethodPolicy
    on_start: Callable[[], None] = lambda: None
    """Background work the service runs while it serves (a scheduler); started by ``start()``."""
    on_stop: Callable[[], None] = lambda: None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    ready: Callable[[], bool] = lambda: True
    """Checked at start; a service that is not ready stays NOT_SERVING (e.g. broken chain)."""
    restrictions: AccessRestrictions | None = None
    """Revoked tokens and suspended agents, refused on every call; None: not enforced."""


class EngramServer:
    def __init__(
        self,
        server: grpc.Server,
        health_servicer: health.HealthServicer,
        spec: ServiceSpec,
        settings: ServerSettings,
        health_server: grpc.Server | None = None,
    ) -> None:
        self._server = server
        self._health = health_servicer
        self._health_server = health_server
        self.spec = spec
        self.settings = settings
        self.port = 0
        self.health_port: int | None = None
        self.metrics_port: int | None = None
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    def start(self) -> EngramServer:
        if self.spec.restrictions is not None:
            self.spec.restrictions.start()
        self._server.start()
        self.spec.on_start()
        if self._health_server is not None:
            self._health_server.start()
        if self.settings.metrics_port is not None:
            self.metrics_port = serve_metrics(
                self.spec.registry, self.settings.host, self.settings.metrics_port
            )
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.spec.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.spec.full_names):
            self._health.set(name, status)
        log.info(
            "serving",
            extra={
                "address": self.address,
                "health_port": self.health_port,
                "metrics_port": self.metrics_port,
                "health": health_pb2.HealthCheckResponse.ServingStatus.Name(status),
            },
        )
        return self

    def stop(self, grace: float | None = None) -> None:
        """Health to NOT_SERVING, wait ``drain_delay_seconds``, refuse new calls, drain, release.

        ``stop(grace)`` with an explicit grace skips the drain delay (tests, fast exits).
        """
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._health.enter_graceful_shutdown()
        if grace is None:
            time.sleep(self.settings.drain_delay_seconds)
            grace = self.settings.grace_seconds
        self._server.stop(grace).wait()
        if self._health_server is not None:  # probes saw NOT_SERVING throughout the drain
            self._health_server.stop(0).wait()
        if self.spec.restrictions is not None:
            self.spec.restrictions.stop()
        self.spec.on_stop()
        log.info("stopped", extra={"address": self.address})

    def wait(self) -> None:
        self._server.wait_for_termination()

    def run_until_signalled(self) -> None:
        """Block until SIGTERM/SIGINT, then stop gracefully."""
        done = threading.Event()

        def _handle(signum: int, _frame: FrameType | None) -> None:
            log.info("signal received, draining", extra={"signal": signum})
            done.set()

        signal.signal(signal.SIGTERM, _handle)
        signal.signal(signal.SIGINT, _handle)
        done.wait()
        self.stop()


def _credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    pair = [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())]
    if settings.tls_client_ca is not None:
        return grpc.ssl_server_credentials(
            pair,
            root_certificates=settings.tls_client_ca.read_bytes(),
            require_client_auth=True,
        )
    return grpc.ssl_server_credentials(pair)


def token_verifier(settings: ServerSettings, audience: str) -> TokenVerifier:
    """Every verification key the settings name; tokens must name ``audience`` in ``aud``."""
    try:
        keys = load_public_keys(settings.public_key_sources())
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{error}: run `engram up` once to create the deployment's keys, or set "
            "ENGRAM_AUTH_PUBLIC_KEY / ENGRAM_AUTH_PUBLIC_KEYS") from None
    if not keys:
        raise ValueError("no token public key found in "
                         f"{[str(p) for p in settings.public_key_sources()]}")
    return TokenVerifier(keys, audience=audience, leeway_seconds=settings.auth_leeway_seconds)


def build_server(settings: ServerSettings, spec: ServiceSpec) -> EngramServer:
    verifier = token_verifier(settings, spec.name)
    interceptors: list[grpc.ServerInterceptor[Any, Any]] = [
        MetricsInterceptor(GrpcMetrics(spec.registry)),
        LoggingInterceptor(),
        ErrorInterceptor(),
        AuthInterceptor(Authorizer(verifier, spec.policy, spec.restrictions)),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=settings.max_workers, thread_name_prefix=f"{spec.name}-rpc"
        ),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ],
    )
    spec.register(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*spec.full_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    target = f"{settings.host}:{settings.port}"
    credentials = _credentials(settings)
    if credentials is None:
        port = server.add_insecure_port(target)
    else:
        port = server.add_secure_port(target, credentials)
    if port == 0:
        raise RuntimeError(f"could not bind {target}")
    health_server, health_port = _health_only(settings, health_servicer)
    engram_server = EngramServer(server, health_servicer, spec, settings, health_server)
    engram_server.port = port
    engram_server.health_port = health_port
    return engram_server


def _health_only(
    settings: ServerSettings, servicer: health.HealthServicer
) -> tuple[grpc.Server | None, int | None]:
    """A plaintext server with nothing but the main server's health servicer on it.

    It answers the same statuses as the main port (one servicer), so a probe sees
    NOT_SERVING as soon as a drain starts; it reveals only whether the service is up.
    """
    if settings.health_port is None:
        return None, None
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"),
        options=[("grpc.so_reuseport", 0)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    target = f"{settings.host}:{settings.health_port}"
    port = server.add_insecure_port(target)
    if port == 0:
        raise RuntimeError(f"could not bind the health port {target}")
    return server, port
