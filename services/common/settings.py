"""Settings shared by every service, read from ``ENGRAM_*`` environment variables.

Each service subclasses :class:`ServerSettings` with its own ``env_prefix``
(``ENGRAM_SHARD_``, ``ENGRAM_GOVERNANCE_`` …) for its own fields; the fields
here that every service shares (``ENGRAM_HOME``, ``ENGRAM_LOG_LEVEL``,
``ENGRAM_AUTH_PUBLIC_KEY``) keep one name across services, and so do the limits on what a
request may carry (:class:`LimitsSettings`, ``ENGRAM_LIMITS_*``). Settings are parsed
once in ``main`` and passed down; nothing else reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.client import TlsFiles
from services.common.tokens import local_public_keys


def _shared(name: str) -> AliasChoices:
    return AliasChoices(name)


def _limit(name: str, default: int, description: str) -> Any:
    return Field(default=default, gt=0, validation_alias=_shared(f"ENGRAM_LIMITS_{name}"),
                 description=description)


_MIB = 1024 * 1024
MAX_AUTH_LEEWAY_SECONDS = 600
"""The most clock skew a service may be told to tolerate (ENGRAM_AUTH_LEEWAY_SECONDS): a token
is accepted up to that long past its ``exp``, so governance lists a revocation that long too."""


class LimitsSettings(BaseSettings):
    """What one request may carry, the same in every service (``ENGRAM_LIMITS_*``).

    Over a limit is INVALID_ARGUMENT, reason LIMIT_EXCEEDED, naming the limit and its
    setting; a message over ``grpc_receive_bytes`` is refused by gRPC (RESOURCE_EXHAUSTED)
    before it is parsed.
    """

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    grpc_receive_bytes: int = _limit(
        "GRPC_RECEIVE_BYTES", 4 * _MIB, "largest request message a server accepts")
    grpc_send_bytes: int = _limit(
        "GRPC_SEND_BYTES", 64 * _MIB, "largest response message a server sends (a full page "
        "of records at their largest; the SDK accepts up to this much)")
    query_bytes: int = _limit("QUERY_BYTES", 8 * 1024, "a search query, UTF-8 bytes")
    content_bytes: int = _limit("CONTENT_BYTES", 32 * 1024, "a record's content, UTF-8 bytes")
    metadata_entries: int = _limit("METADATA_ENTRIES", 32, "metadata keys of one record")
    metadata_bytes: int = _limit(
        "METADATA_BYTES", 8 * 1024, "a record's metadata, keys and values together, UTF-8 bytes")
    tags_per_record: int = _limit("TAGS_PER_RECORD", 32, "tags on one record")
    tag_chars: int = _limit("TAG_CHARS", 64, "characters in one tag")
    tags_per_filter: int = _limit("TAGS_PER_FILTER", 32, "tags in one list or search filter")
    json_depth: int = _limit("JSON_DEPTH", 64, "nesting of arrays and objects in a JSON field")
    json_bytes: int = _limit("JSON_BYTES", 4 * _MIB, "one JSON field, UTF-8 bytes")
    batch_items: int = _limit(
        "BATCH_ITEMS", 1000, "records in one batch write, candidates in one gate call, "
        "agents in one trust lookup")
    page_size: int = _limit(
        "PAGE_SIZE", 1000, "the most items one page holds (a larger page_size is lowered "
        "to it, as AIP-158 asks)")
    page_token_chars: int = _limit("PAGE_TOKEN_CHARS", 1024, "characters in a page token")


LIMIT_DEFAULTS = LimitsSettings.model_construct()
"""Every limit at its default, read from no environment (domain code's default argument)."""


class TokenKeySettings(BaseSettings):
    """What verifies bearer tokens, read the same way by every service and by the HTTP gateway
    (which verifies them only to budget request bodies by token)."""

    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_", frozen=True, extra="ignore", populate_by_name=True
    )

    home: Path = Field(default=Path(".engram"), validation_alias=_shared("ENGRAM_HOME"))
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
        default=30.0, ge=0, le=MAX_AUTH_LEEWAY_SECONDS,
        validation_alias=_shared("ENGRAM_AUTH_LEEWAY_SECONDS"),
        description="clock skew tolerated when checking a token's exp and iat",
    )

    @property
    def names_public_keys(self) -> bool:
        """Whether the environment names the keys (else ``$ENGRAM_HOME``'s are used)."""
        return self.auth_public_key is not None or any(
            p.strip() for p in self.auth_public_keys.split(","))

    def public_key_sources(self) -> list[Path]:
        """Every file or directory to load verification keys from."""
        extra = [Path(p.strip()) for p in self.auth_public_keys.split(",") if p.strip()]
        if self.auth_public_key is not None:
            return [self.auth_public_key, *extra]
        if extra:
            return extra
        return local_public_keys(self.home)


class ServerSettings(TokenKeySettings):
    # model_config: TokenKeySettings' (ENGRAM_ prefix, frozen), inherited.
    log_level: str = Field(default="INFO", validation_alias=_shared("ENGRAM_LOG_LEVEL"))
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
    db_pool_size: int = Field(
        default=8, ge=1, le=512,
        description="database connections kept open (Postgres opens as many again under load, "
        "SQLite ten more)",
    )
    db_pool_timeout_seconds: float = Field(
        default=5.0, gt=0, le=600,
        description="how long a call waits for a database connection when every one is in "
        "use; then RESOURCE_EXHAUSTED DATABASE_BUSY, with RetryInfo",
    )
    max_concurrent_rpcs: int = Field(
        default=128, ge=1,
        description="calls this process runs at once; one more is answered RESOURCE_EXHAUSTED "
        "(CONCURRENCY_LIMIT, with RetryInfo) at once instead of queueing behind them",
    )
    admission: Literal["static", "adaptive"] = Field(
        default="static",
        description="static: max_concurrent_rpcs calls at once, first come first served. "
        "adaptive: as many as keep each method near its uncongested latency (at most "
        "max_concurrent_rpcs), shared fairly between callers; the rest are answered "
        "RESOURCE_EXHAUSTED (OVERLOADED, with RetryInfo) before they are parsed or "
        "authenticated (services/common/adaptive.py)",
    )
    max_streams_per_agent: int = Field(
        default=32, ge=1,
        description="server streams (snapshots, replays, downloads) one agent may hold open "
        "at once; one more is RESOURCE_EXHAUSTED (STREAM_LIMIT): a stream holds a slot of "
        "max_concurrent_rpcs until it ends, and one caller must not hold them all",
    )
    max_streams_per_fleet: int | None = Field(
        default=None, ge=1,
        description="server streams the agents of one fleet may hold open at once, all "
        "together; one more is RESOURCE_EXHAUSTED (STREAM_LIMIT). Default: half of "
        "max_concurrent_rpcs, so the streams of one fleet (an admin can mint tokens for many "
        "agent ids) never hold every slot and other fleets' calls still get in",
    )
    max_streams: int | None = Field(
        default=None, ge=1,
        description="server streams open at once on this process, every fleet together; one "
        "more is RESOURCE_EXHAUSTED (STREAM_LIMIT, scope service), and its last quarter goes "
        "only to fleets holding fewer than a quarter of it. Default: three quarters of "
        "max_concurrent_rpcs, so two fleets at their max_streams_per_fleet never hold every "
        "slot: unary calls and other fleets' streams still get in",
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
    page_token_key_file: Path | None = Field(
        default=None,
        description="the secret (32+ random bytes) that signs this service's page tokens; "
        "default $ENGRAM_HOME/<service>/page-token.key, created on first start. Replicas of "
        "one service must share it, or a page token from one fails on another",
    )
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    max_receive_bytes: int | None = Field(
        default=None, gt=0,
        description="this service's largest request message; default "
        "ENGRAM_LIMITS_GRPC_RECEIVE_BYTES (governance: 64 MiB, for the shard's gate calls)",
    )
    health_port: int | None = Field(
        default=None,
        description="a plaintext port that serves only grpc.health.v1, for probes that cannot "
        "speak TLS (Kubernetes' native gRPC probes); unset: health is on the main port only",
    )

    def streams_per_fleet(self) -> int:
        """``max_streams_per_fleet``, or half of ``max_concurrent_rpcs`` (at least 1)."""
        if self.max_streams_per_fleet is not None:
            return self.max_streams_per_fleet
        return max(1, self.max_concurrent_rpcs // 2)

    def streams_total(self) -> int:
        """``max_streams``, or three quarters of ``max_concurrent_rpcs`` (at least 1)."""
        if self.max_streams is not None:
            return self.max_streams
        return max(1, self.max_concurrent_rpcs * 3 // 4)

    def receive_limit(self) -> int:
        return self.max_receive_bytes or self.limits.grpc_receive_bytes

    def database_options(self) -> dict[str, Any]:
        """``Database``'s pool settings, as this service's environment sets them."""
        return {"pool_size": self.db_pool_size, "pool_timeout": self.db_pool_timeout_seconds}

    def data_dir(self, service: str) -> Path:
        return self.home / service


class GovernanceClientSettings(ServerSettings):
    """A service that calls governance (the shard's gate, the others' revocation polls): how
    its calls reach governance over TLS (``ENGRAM_<SERVICE>_GOVERNANCE_TLS_*``)."""

    governance_tls_ca: Path | None = Field(
        default=None, description="CA that signed governance's certificate; set, this service "
        "calls governance over TLS")
    governance_tls_cert: Path | None = Field(
        default=None, description="this service's client certificate, for a governance that "
        "requires mutual TLS")
    governance_tls_key: Path | None = Field(
        default=None, description="the private key of governance_tls_cert")

    def governance_tls(self) -> TlsFiles:
        return TlsFiles(tls_ca=self.governance_tls_ca, tls_cert=self.governance_tls_cert,
                        tls_key=self.governance_tls_key)


def s3_options(settings: BaseSettings, endpoint_url: str | None, region: str | None,
               key_id: str | None, secret: SecretStr | None) -> dict[str, Any]:
    """The S3 blob store's connection options; the two keys go together or not at all (unset:
    boto3's own chain, ``AWS_*`` variables, a profile, the pod's role). One without the other
    is refused here, at start, not by the first S3 call (a background repair, maybe)."""
    if (key_id is None) != (secret is None):
        prefix = str(settings.model_config.get("env_prefix", "ENGRAM_"))
        raise ValueError(f"set both {prefix}S3_ACCESS_KEY_ID and {prefix}S3_SECRET_ACCESS_KEY, "
                         "or neither (boto3 then finds keys itself)")
    return {"endpoint_url": endpoint_url, "region_name": region, "access_key_id": key_id,
            "secret_access_key": secret.get_secret_value() if secret is not None else None}
