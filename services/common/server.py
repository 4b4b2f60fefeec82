"""One function assembles a service's gRPC server, so tests start what production runs.

``build_server(settings, spec)`` wires interceptors (metrics, logging, errors, concurrency,
auth, rate, records written, streams, NUL-free text), explicit message size limits
(``ENGRAM_LIMITS_GRPC_*``), the standard ``grpc.health.v1`` servicer, reflection, optional
TLS/mTLS, an optional plaintext health-only port (``health_port``: probes that cannot speak
TLS) and the ``/metrics`` endpoint. Health says SERVING only once a call can succeed: the service's
``ready`` check passed, the access restrictions are loaded and its ``warm_up`` (an index
loaded, a dependency connected) finished. :meth:`EngramServer.stop` flips health to
NOT_SERVING before draining in-flight calls for ``grace_seconds``.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.common.access import AccessRestrictions
from services.common.adaptive import ADAPTIVE_ROOM, AdaptiveAdmissionInterceptor, AdaptiveLimit
from services.common.admission import (
    READ,
    WRITE,
    ConcurrencyLimit,
    MethodKinds,
    RateLimiter,
    RecordCounts,
    RecordRate,
    StreamsPerAgent,
)
from services.common.auth import Authorizer, MethodPolicy
from services.common.interceptors import (
    AuthInterceptor,
    ConcurrencyInterceptor,
    ErrorInterceptor,
    LoggingInterceptor,
    MetricsInterceptor,
    RateLimitInterceptor,
    RecordRateInterceptor,
    StreamLimitInterceptor,
    TextInterceptor,
)
from services.common.metrics import GrpcMetrics, Tally, serve_metrics
from services.common.settings import ServerSettings
from services.common.startup import StartupError
from services.common.tokens import TokenVerifier, load_public_keys
from services.common.tracing import server_interceptors

log = logging.getLogger("engram.server")

SPARE_WORKERS = 8
"""Threads beyond ``max_concurrent_rpcs``: a call past the limit gets a thread to be refused."""
LIVENESS = "engram.liveness"
"""The health name a liveness probe asks: SERVING from start() until a stop begins, whatever
the database or the warm-up. Overall health ("") is readiness: NOT_SERVING within a second of
the database going away, and a liveness probe on it killed every replica of every service in
a database failover of 30 s, which then could not start again until the database was back
(CrashLoopBackOff; found in review, 2026-11-30)."""

WARM_UP_WAIT_SECONDS = 10.0
"""How long ``start()`` waits for the warm-up before it returns (health NOT_SERVING) and lets
the warm-up finish in the background (a dependency down at start)."""
PROBE_INTERVAL_SECONDS = 1.0
"""How often a serving service checks its database (``ServiceSpec.probe``)."""


@dataclass
class ServiceSpec:
    """What a service contributes to the shared wiring."""

    name: str
    """Short name (``shard``), used in logs and metrics."""
    full_names: Sequence[str]
    """Fully-qualified gRPC service names (``engram.shard.v1.ShardService``)."""
    register: Callable[[grpc.Server], None]
    policy: MethodPolicy
    kinds: MethodKinds
    """Whether each RPC reads or writes (declared beside ``policy``), for the rate limits."""
    on_start: Callable[[], None] = lambda: None
    """Background work the service runs while it serves (a scheduler); started by ``start()``."""
    on_stop: Callable[[], None] = lambda: None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    ready: Callable[[], bool] = lambda: True
    """Checked at start; a service that is not ready stays NOT_SERVING (e.g. broken chain)."""
    warm_up: Callable[[threading.Event], None] = lambda _stopping: None
    """What must be done before a call can succeed (load an index, connect a dependency);
    health says NOT_SERVING until it returns. It returns early once the event is set (stop)."""
    restrictions: AccessRestrictions | None = None
    """Revoked tokens and suspended agents, refused on every call; None: not enforced."""
    probe: Callable[[], bool] | None = None
    """Checked every ``PROBE_INTERVAL_SECONDS`` while serving (the service's database
    answers): False flips health to NOT_SERVING until it passes again, without a restart."""
    record_counts: RecordCounts = field(default_factory=dict)
    """How many records a request of each record-writing RPC carries (declared beside
    ``kinds``), counted against ``record_rate``."""
    record_rate: RecordRate | None = None
    """Records a second one agent may write (the shard's ENGRAM_SHARD_RATE_LIMIT_RECORDS);
    None: not limited."""


class EngramServer:
    def __init__(
        self,
        server: grpc.Server,
        health_servicer: health.HealthServicer,
        spec: ServiceSpec,
        settings: ServerSettings,
        health_server: grpc.Server | None = None,
        executors: Sequence[futures.ThreadPoolExecutor] = (),
    ) -> None:
        self._server = server
        self._health = health_servicer
        self._health_server = health_server
        self._executors = tuple(executors)
        """The servers' worker pools: gRPC never shuts them down, so ``stop`` does (an idle
        worker thread would otherwise outlive the server, one per call it ever ran at once)."""
        self.spec = spec
        self.settings = settings
        self.port = 0
        self.health_port: int | None = None
        self.metrics_port: int | None = None
        self._stopped = threading.Event()
        self._health_lock = threading.Lock()
        """Held while health is set: SERVING is set only if ``ready()`` holds under it, and a
        check that fails later (``set_serving(False)`` after ``ready()`` turned false) takes
        it too, so a warm-up that ends after that check cannot set SERVING over it."""

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
        # The process answers: alive, whatever its readiness (the database, the warm-up).
        self._health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        if self.settings.metrics_port is not None:
            self.metrics_port = serve_metrics(
                self.spec.registry, self.settings.host, self.settings.metrics_port
            )
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if not self.spec.ready():
            return self
        warming = threading.Thread(target=self._serve_when_warm, name=f"{self.spec.name}-warm-up",
                                   daemon=True)
        warming.start()
        warming.join(WARM_UP_WAIT_SECONDS)
        if warming.is_alive():
            log.warning("not ready yet: health stays NOT_SERVING until the warm-up finishes "
                        "(a dependency unreachable?)", extra={"address": self.address})
        return self

    def _serve_when_warm(self) -> None:
        """Health to SERVING once a call can succeed (unless a stop began meanwhile)."""
        try:
            if self.spec.restrictions is not None:
                self.spec.restrictions.wait_loaded(self._stopped)
            self.spec.warm_up(self._stopped)
        except Exception:  # the service still serves; it says why it is not ready
            log.exception("warm-up failed: health stays NOT_SERVING")
            return
        with self._health_lock:
            if self._stopped.is_set():
                return
            serving = self.spec.ready()  # a check that ran meanwhile (the chain) may say no
            if serving:
                self._set_health(health_pb2.HealthCheckResponse.SERVING)
            else:
                log.warning("not ready after the warm-up: health stays NOT_SERVING")
        if self.spec.probe is not None:
            threading.Thread(target=self._watch, args=(self.spec.probe, serving),
                             name=f"{self.spec.name}-probe", daemon=True).start()

    def _watch(self, probe: Callable[[], bool], serving: bool) -> None:
        """Readiness follows the probe while serving: NOT_SERVING when the database goes away,
        SERVING again when it answers (and ``ready()`` still holds), until a stop begins."""
        while not self._stopped.wait(PROBE_INTERVAL_SECONDS):
            try:
                ok = probe()
            except Exception:  # a probe that fails is a probe that says no
                ok = False
            with self._health_lock:
                ok = ok and self.spec.ready()
                if ok == serving or self._stopped.is_set():
                    continue
                serving = ok
                if ok:
                    log.info("ready again: the probe passes")
                else:
                    log.warning("not ready: the probe fails (database unreachable?); "
                                "NOT_SERVING until it passes")
                self._set_health(health_pb2.HealthCheckResponse.SERVING if ok
                                 else health_pb2.HealthCheckResponse.NOT_SERVING)

    def _set_health(self, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
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

    def set_serving(self, serving: bool) -> None:
        """Health for every name of this service (e.g. NOT_SERVING when a check fails later)."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        with self._health_lock:
            self._set_health(status)

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
        for executor in self._executors:  # idle workers exit; a stuck handler is not waited for
            executor.shutdown(wait=False, cancel_futures=True)
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


class _ErrorCollector(Collector):
    """``engram_rpc_errors_total{service, code, reason}``: every error answered, by its reason
    (RATE_LIMITED and CONCURRENCY_LIMIT are the refusals under load; STORAGE_FULL, ...)."""

    def __init__(self, service: str, errors: Tally) -> None:
        self._service = service
        self._errors = errors

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "engram_rpc_errors", "RPCs answered with an error, by gRPC code and Engram reason.",
            labels=["service", "code", "reason"])
        for (code, reason), amount in self._errors.items():
            family.add_metric([self._service, code, reason], amount)
        yield family


class _AdmissionCollector(Collector):
    """``engram_admission_limit{service}`` and ``engram_admission_in_flight{service}``: the
    adaptive limit as it moves, and the calls it holds."""

    def __init__(self, service: str, limit: AdaptiveLimit) -> None:
        self._service = service
        self._limit = limit

    def collect(self) -> Iterator[Metric]:
        for name, text, value in (
                ("engram_admission_limit", "Calls adaptive admission runs at once now.",
                 self._limit.limit),
                ("engram_admission_in_flight", "Calls adaptive admission holds now.",
                 self._limit.in_flight)):
            family = GaugeMetricFamily(name, text, labels=["service"])
            family.add_metric([self._service], value)
            yield family


def _in_flight_ceiling(settings: ServerSettings) -> int:
    """Calls in flight at most, streams included. Adaptive admission decides for unary calls
    and may let a caller with none in flight a quarter past its limit: the static limit then
    only backs it up."""
    if settings.admission == "adaptive":
        return math.ceil(settings.max_concurrent_rpcs * ADAPTIVE_ROOM)
    return settings.max_concurrent_rpcs


def _adaptive(settings: ServerSettings, authorizer: Authorizer,
              spec: ServiceSpec) -> list[grpc.ServerInterceptor[Any, Any]]:
    if settings.admission != "adaptive":
        return []
    limit = AdaptiveLimit(settings.max_concurrent_rpcs, _setting(settings, "admission"))
    spec.registry.register(_AdmissionCollector(spec.name, limit))
    return [AdaptiveAdmissionInterceptor(limit, authorizer.is_public, authorizer.admission_key)]


def _rate_limiter(settings: ServerSettings) -> RateLimiter:
    return RateLimiter(
        {READ: (settings.rate_limit_reads, settings.rate_limit_read_burst),
         WRITE: (settings.rate_limit_writes, settings.rate_limit_write_burst)},
        {READ: f"{_setting(settings, 'rate_limit_reads')}, "
               f"{_setting(settings, 'rate_limit_read_burst')}",
         WRITE: f"{_setting(settings, 'rate_limit_writes')}, "
                f"{_setting(settings, 'rate_limit_write_burst')}"})


def _setting(settings: ServerSettings, field_name: str) -> str:
    """The environment variable an operator sets for ``field_name`` (ENGRAM_SHARD_TLS_KEY)."""
    return f"{settings.model_config.get('env_prefix', 'ENGRAM_')}{field_name}".upper()


def _read_pem(settings: ServerSettings, field_name: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise StartupError(f"{_setting(settings, field_name)}: cannot read {path}: "
                           f"{error.strerror or error}") from None
    if b"-----BEGIN " not in data:
        raise StartupError(f"{_setting(settings, field_name)}: {path} holds no PEM block")
    return data


def _credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    """TLS when a certificate and its key are both set, plaintext when none of the three TLS
    settings is; anything in between refuses to start rather than serve in plaintext."""
    cert_name, key_name, ca_name = (_setting(settings, f) for f in
                                    ("tls_cert", "tls_key", "tls_client_ca"))
    if settings.tls_cert is None and settings.tls_key is None:
        if settings.tls_client_ca is not None:
            raise StartupError(f"{ca_name} is set but {cert_name} and {key_name} are not: "
                               "client certificates need a TLS server; set all three or none")
        return None
    if settings.tls_key is None:
        raise StartupError(f"{cert_name} is set but {key_name} is not: "
                           "a TLS certificate needs its private key")
    if settings.tls_cert is None:
        raise StartupError(f"{key_name} is set but {cert_name} is not: "
                           "a TLS private key needs its certificate")
    certificate = _read_pem(settings, "tls_cert", settings.tls_cert)
    key = _read_pem(settings, "tls_key", settings.tls_key)
    _check_pair(certificate, key, cert_name, key_name)
    pair = [(key, certificate)]
    if settings.tls_client_ca is not None:
        return grpc.ssl_server_credentials(
            pair,
            root_certificates=_read_pem(settings, "tls_client_ca", settings.tls_client_ca),
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


def _check_pair(certificate: bytes, key: bytes, cert_name: str, key_name: str) -> None:
    """gRPC would only fail at the first handshake; say at start which file is wrong."""
    try:
        public = x509.load_pem_x509_certificate(certificate).public_key()
    except ValueError:
        raise StartupError(f"{cert_name}: not a PEM X.509 certificate") from None
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise StartupError(f"{key_name}: not an unencrypted PEM private key") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if (public.public_bytes(serialization.Encoding.DER, spki)
            != private.public_key().public_bytes(serialization.Encoding.DER, spki)):
        raise StartupError(f"{key_name} is not the private key of the certificate in {cert_name}")


def streams_limit(settings: ServerSettings) -> StreamsPerAgent:
    """The stream caps of ``settings``: per agent, per fleet and in all."""
    return StreamsPerAgent(settings.max_streams_per_agent,
                           _setting(settings, "max_streams_per_agent"),
                           settings.streams_per_fleet(),
                           _setting(settings, "max_streams_per_fleet"),
                           settings.streams_total(), _setting(settings, "max_streams"))


def build_server(settings: ServerSettings, spec: ServiceSpec) -> EngramServer:
    verifier = token_verifier(settings, spec.name)
    credentials = _credentials(settings)
    if set(spec.kinds) != set(spec.policy):
        raise StartupError(f"{spec.name}: every RPC needs both an access entry and a read/write "
                           f"kind; differ: {sorted(set(spec.kinds) ^ set(spec.policy))}")
    authorizer = Authorizer(verifier, spec.policy, spec.restrictions)
    errors = ErrorInterceptor()
    spec.registry.register(_ErrorCollector(spec.name, errors.errors))
    # process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds, ...
    ProcessCollector(registry=spec.registry)
    in_flight = _in_flight_ceiling(settings)
    interceptors: list[grpc.ServerInterceptor[Any, Any]] = [
        *server_interceptors(),  # OpenTelemetry, outermost, when tracing is on
        MetricsInterceptor(GrpcMetrics(spec.registry)),
        LoggingInterceptor(),
        errors,
        ConcurrencyInterceptor(ConcurrencyLimit(in_flight,
                                                _setting(settings, "max_concurrent_rpcs")),
                               authorizer.is_public),
        *_adaptive(settings, authorizer, spec),
        AuthInterceptor(authorizer),
        RateLimitInterceptor(_rate_limiter(settings), spec.kinds),
        *([RecordRateInterceptor(spec.record_rate, spec.record_counts)]
          if spec.record_rate is not None else []),
        StreamLimitInterceptor(streams_limit(settings),
                               spec.kinds),
        TextInterceptor(),
    ]
    workers = futures.ThreadPoolExecutor(  # spare threads answer refusals and health while full
        max_workers=in_flight + SPARE_WORKERS,
        thread_name_prefix=f"{spec.name}-rpc",
    )
    server = grpc.server(
        workers,
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", settings.receive_limit()),
            ("grpc.max_send_message_length", settings.limits.grpc_send_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    spec.register(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    # NOT_SERVING until start() has run on_start and checked ready() (the servicer says
    # SERVING for "" from birth, and a shard warming its index answers no search yet).
    for name in ("", *spec.full_names, LIVENESS):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*spec.full_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    target = f"{settings.host}:{settings.port}"
    if credentials is None:
        port = server.add_insecure_port(target)
    else:
        port = server.add_secure_port(target, credentials)
    if port == 0:
        raise RuntimeError(f"could not bind {target}")
    health_server, health_port, health_workers = _health_only(settings, health_servicer)
    engram_server = EngramServer(server, health_servicer, spec, settings, health_server,
                                 executors=(workers, *health_workers))
    engram_server.port = port
    engram_server.health_port = health_port
    return engram_server


def _health_only(
    settings: ServerSettings, servicer: health.HealthServicer
) -> tuple[grpc.Server | None, int | None, tuple[futures.ThreadPoolExecutor, ...]]:
    """A plaintext server with nothing but the main server's health servicer on it.

    It answers the same statuses as the main port (one servicer), so a probe sees
    NOT_SERVING as soon as a drain starts; it reveals only whether the service is up.
    """
    if settings.health_port is None:
        return None, None, ()
    workers = futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health")
    server = grpc.server(
        workers,
        options=[("grpc.so_reuseport", 0)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    target = f"{settings.host}:{settings.health_port}"
    port = server.add_insecure_port(target)
    if port == 0:
        raise RuntimeError(f"could not bind the health port {target}")
    return server, port, (workers,)
