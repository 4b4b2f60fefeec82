"""Settings shared by every service, read from ``ENGRAM_*`` environment variables.

Each service subclasses :class:`ServerSettings` with its own ``env_prefix``
(``ENGRAM_SHARD_``, ``ENGRAM_GOVERNANCE_`` …) for its own fields; the fields
here that every service shares (``ENGRAM_HOME``, ``ENGRAM_LOG_LEVEL``,
``ENGRAM_AUTH_PUBLIC_KEY``) keep one name across services. Settings are parsed
once in ``main`` and passed down; nothing else reads the environment.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.tokens import local_public_keys


def _shared(name: str) -> AliasChoices:
    return AliasChoices(name)


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_", frozen=True, extra="ignore", populate_by_name=True
    )

    home: Path = Field(default=Path(".engram"), validation_alias=_shared("ENGRAM_HOME"))
    log_level: str = Field(default="INFO", validation_alias=_shared("ENGRAM_LOG_LEVEL"))
    auth_public_key: Path | None = Field(
        default=None,
        validation_alias=_shared("ENGRAM_AUTH_PUBLIC_KEY"),
        description="Ed25519 public key (PEM) that verifies bearer tokens; "
        "default $ENGRAM_HOME/auth/signing.pub plus every *.pub in $ENGRAM_HOME/auth/keys/",
    )
    auth_public_keys: str = Field(
        default="",
        validation_alias=_shared("ENGRAM_AUTH_PUBLIC_KEYS"),
        description="more verification keys, comma-separated: each a PEM file or a directory "
        "whose *.pub / *.pem files are all loaded (key rotation: old and new keys at once)",
    )
    auth_leeway_seconds: float = Field(
        default=30.0, ge=0, le=600, validation_alias=_shared("ENGRAM_AUTH_LEEWAY_SECONDS"),
        description="clock skew tolerated when checking a token's exp and iat",
    )
    auth_restrictions_refresh_seconds: float = Field(
        default=2.0, gt=0, le=300,
        validation_alias=_shared("ENGRAM_AUTH_RESTRICTIONS_REFRESH_SECONDS"),
        description="how often a service asks governance for revoked tokens and suspended "
        "agents: a revocation or suspension is enforced everywhere within this plus one call",
    )
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = Field(
        default=None, description="Prometheus /metrics port; unset disables the endpoint"
    )
    max_concurrent_rpcs: int = Field(
        default=128, ge=1,
        description="calls this process runs at once; one more is answered RESOURCE_EXHAUSTED "
        "(CONCURRENCY_LIMIT, with RetryInfo) at once instead of queueing behind them",
    )
    rate_limit_reads: float = Field(
        default=200.0, ge=0,
        description="read calls a second one agent may make to this service (token bucket); "
        "0 turns the limit off; over it: RESOURCE_EXHAUSTED (RATE_LIMITED, with RetryInfo)",
    )
    rate_limit_read_burst: int = Field(default=400, ge=1,
                                       description="read calls one agent may make at once")
    rate_limit_writes: float = Field(
        default=100.0, ge=0,
        description="write calls a second one agent may make to this service; 0: off",
    )
    rate_limit_write_burst: int = Field(default=200, ge=1,
                                        description="write calls one agent may make at once")
    grace_seconds: float = 5.0
    drain_delay_seconds: float = Field(
        default=1.0,
        description="after health turns NOT_SERVING, keep serving this long so load balancers "
        "and readiness probes stop routing here before in-flight calls drain",
    )
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = Field(
        default=None, description="CA bundle; when set, clients must present a certificate (mTLS)"
    )
    health_port: int | None = Field(
        default=None,
        description="a plaintext port that serves only grpc.health.v1, for probes that cannot "
        "speak TLS (Kubernetes' native gRPC probes); unset: health is on the main port only",
    )

    def public_key_sources(self) -> list[Path]:
        """Every file or directory to load verification keys from."""
        extra = [Path(p.strip()) for p in self.auth_public_keys.split(",") if p.strip()]
        if self.auth_public_key is not None:
            return [self.auth_public_key, *extra]
        if extra:
            return extra
        return local_public_keys(self.home)

    def data_dir(self, service: str) -> Path:
        return self.home / service
