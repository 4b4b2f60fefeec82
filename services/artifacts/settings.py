"""Artifacts settings (``ENGRAM_ARTIFACTS_*``): where its database and blobs live, and the
limits on what a request may carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.artifacts.domain.validation import (
    DEFAULT_MAX_UPLOAD_BYTES,
    MAX_DOCUMENT_BYTES,
    MAX_METADATA_BYTES,
    ArtifactLimits,
)
from services.common.limits import DEFAULT_JSON_DEPTH
from services.common.settings import GovernanceClientSettings, s3_options


class ArtifactsSettings(GovernanceClientSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_ARTIFACTS_", frozen=True, extra="ignore", populate_by_name=True
    )

    port: int = 50053
    db_url: str | None = None
    """Default: sqlite under $ENGRAM_HOME/artifacts/artifacts.db."""
    blob_url: str | None = None
    """``file:///dir`` or ``s3://bucket/prefix``; default file://$ENGRAM_HOME/artifacts/blobs."""
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    """Never shown (``repr``, dumps); with s3_access_key_id or neither."""
    s3_part_size_mb: int = 8
    s3_parts_in_flight: int = 4
    s3_single_put_max_mb: int = 1024
    """Blobs up to this size go up in one PutObject; larger ones as a multipart upload."""
    s3_spool_dir: str | None = None
    """Where uploads are spooled before going to S3; default $ENGRAM_HOME/artifacts/spool."""
    resolve_retry_delay_seconds: float = 0.05
    """Pause before the one retry of a critical pointer (covers transient I/O)."""
    migrate: bool = True
    max_upload_bytes: int = Field(default=DEFAULT_MAX_UPLOAD_BYTES, gt=0)
    """The largest artifact an upload may carry; a larger one is refused, nothing stored."""
    max_document_bytes: int = Field(default=MAX_DOCUMENT_BYTES, gt=0)
    """Event payloads, snapshot states and manifests (canonical JSON bytes)."""
    max_metadata_bytes: int = Field(default=MAX_METADATA_BYTES, gt=0)
    """Run and artifact metadata and evidence metadata (canonical JSON bytes)."""
    json_depth: int = Field(default=DEFAULT_JSON_DEPTH, gt=0,
                            validation_alias=AliasChoices("ENGRAM_LIMITS_JSON_DEPTH"))
    """How deep any JSON document may nest (shared by every service)."""
    governance_addr: str | None = None
    """host:port of governance, polled for revoked tokens and suspended agents; unset: they
    are not refused here (`engram up`, compose and the kustomize base set it)."""
    service_token_file: Path | None = None
    """Bearer token (role "service") this process presents to governance."""

    def artifact_limits(self) -> ArtifactLimits:
        return ArtifactLimits(document_bytes=self.max_document_bytes,
                              metadata_bytes=self.max_metadata_bytes,
                              json_depth=self.json_depth, upload_bytes=self.max_upload_bytes,
                              batch_items=self.limits.batch_items)

    def database_url(self) -> str:
        default = (self.data_dir("artifacts") / "artifacts.db").resolve()
        return self.db_url or f"sqlite:///{default}"

    def blob_store_url(self) -> str:
        return self.blob_url or (self.data_dir("artifacts") / "blobs").resolve().as_uri()

    def blob_store_options(self) -> dict[str, Any]:
        return {**s3_options(self, self.s3_endpoint_url, self.s3_region,
                             self.s3_access_key_id, self.s3_secret_access_key),
                "part_size": self.s3_part_size_mb * 1024 * 1024,
                "parts_in_flight": self.s3_parts_in_flight,
                "single_put_max": self.s3_single_put_max_mb * 1024 * 1024,
                "spool_dir": self.s3_spool_dir or str(self.data_dir("artifacts") / "spool")}
