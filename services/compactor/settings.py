"""Compactor settings: ``ENGRAM_COMPACTOR_*`` (plus the shared ``ENGRAM_HOME`` …)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from engram.client import TlsFiles
from services.common.limits import MAX_POLICY_DAYS
from services.common.settings import GovernanceClientSettings, s3_options
from services.compactor.domain.model import TierConfig


class CompactorSettings(GovernanceClientSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_COMPACTOR_", frozen=True, extra="ignore", populate_by_name=True
    )

    db_url: str | None = Field(
        default=None, description="default sqlite:///$ENGRAM_HOME/compactor/compactor.db")
    blob_url: str | None = Field(
        default=None, description="file:///dir or s3://bucket/prefix; "
        "default file://$ENGRAM_HOME/compactor/blobs")
    # ENGRAM_COMPACTOR_S3_*, as the artifacts service's ENGRAM_ARTIFACTS_S3_*; _BLOB_ENDPOINT_URL
    # and _BLOB_REGION, the compactor's first names, still work (S3_* wins when both are set).
    s3_endpoint_url: str | None = Field(
        default=None, description="S3-compatible endpoint", validation_alias=AliasChoices(
            "ENGRAM_COMPACTOR_S3_ENDPOINT_URL", "ENGRAM_COMPACTOR_BLOB_ENDPOINT_URL"))
    s3_region: str | None = Field(default=None, validation_alias=AliasChoices(
        "ENGRAM_COMPACTOR_S3_REGION", "ENGRAM_COMPACTOR_BLOB_REGION"))
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = Field(
        default=None, description="never shown (repr, dumps); with s3_access_key_id or neither")
    port: int = 50054
    shard_addr: str = "127.0.0.1:50051"
    service_token_file: Path | None = Field(
        default=None, description="bearer token (role service, fleet system) for the shard")
    shard_timeout_seconds: float = 60.0
    shard_tls_ca: Path | None = Field(
        default=None, description="CA that signed the shard's certificate; set, calls use TLS")
    shard_tls_cert: Path | None = Field(
        default=None, description="client certificate, for a shard that requires mutual TLS")
    shard_tls_key: Path | None = Field(default=None, description="that certificate's key")
    migrate: bool = Field(default=True, description="apply the schema migrations at start")
    governance_addr: str | None = Field(
        default=None, description="governance, polled for revoked tokens and suspended agents "
        "(with service_token_file); unset: they are not refused here")

    hot_size: int = Field(default=10, ge=1, description="iterations kept with full detail")
    rotate_bytes: int = Field(default=5 * 1024 * 1024, ge=256,
                              description="warm segment size that triggers rotation")
    snapshot_every: int = Field(default=25, ge=1, description="cold snapshot every K iterations")
    keep_snapshots: int = Field(default=10, ge=0, description="cold snapshots kept unless pinned")

    memory_compaction_interval_seconds: float = Field(
        default=0.0, ge=0.0, description="run memory compaction this often; 0 turns it off")
    memory_compaction_fleets: str = Field(
        default="", description="comma-separated fleets the schedule compacts")
    memory_importance_below: float = Field(default=0.3, gt=0.0, le=1.0)
    memory_older_than_days: float = Field(
        default=30.0, ge=0.0, le=MAX_POLICY_DAYS, allow_inf_nan=False,
        description="the scheduled compaction's age in days (at most 100,000, as a policy "
        "run's; past it every scheduled pass was refused)")
    tier_repair_interval_seconds: float = Field(
        default=5.0, gt=0.0, description="how often runs with unfinished tier work (seals, "
        "snapshots) are looked for and finished; the first pass runs at start")
    tier_repair_backoff_seconds: float = Field(
        default=1.0, gt=0.0, description="wait after a run's first failed repair; doubles "
        "with each further failure")
    tier_repair_backoff_max_seconds: float = Field(
        default=300.0, gt=0.0, description="the longest wait between repairs of a failing run")

    def shard_tls(self) -> TlsFiles:
        return TlsFiles(tls_ca=self.shard_tls_ca, tls_cert=self.shard_tls_cert,
                        tls_key=self.shard_tls_key)


    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{(self.data_dir('compactor') / 'compactor.db')}"

    def blob_store_url(self) -> str:
        return self.blob_url or (self.data_dir("compactor") / "blobs").resolve().as_uri()

    def blob_store_options(self) -> dict[str, Any]:
        return s3_options(self, self.s3_endpoint_url, self.s3_region, self.s3_access_key_id,
                          self.s3_secret_access_key)

    def tier_config(self) -> TierConfig:
        return TierConfig(hot_size=self.hot_size, rotate_bytes=self.rotate_bytes,
                          snapshot_every=self.snapshot_every, keep_snapshots=self.keep_snapshots)

    def scheduled_fleets(self) -> list[str]:
        return [f.strip() for f in self.memory_compaction_fleets.split(",") if f.strip()]
