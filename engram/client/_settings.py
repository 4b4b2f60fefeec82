"""Client settings, parsed once from ``ENGRAM_*`` variables by the caller's ``main``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class TlsFiles(TypedDict, total=False):
    """The TLS keyword arguments of every client and of ``open_channel`` (``TlsFiles()``:
    none, a plaintext channel)."""

    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None


DEFAULT_PORTS = {"shard": 50051, "governance": 50052, "artifacts": 50053, "compactor": 50054}


class ClientSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_", frozen=True, extra="ignore")

    home: Path = Path(".engram")
    token: str | None = Field(default=None, description="bearer token; default: the admin token")
    shard_addr: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['shard']}",
        validation_alias=AliasChoices("ENGRAM_SHARD_ADDR", "ENGRAM_SHARD_TARGET"),
    )
    governance_addr: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['governance']}",
        validation_alias=AliasChoices("ENGRAM_GOVERNANCE_ADDR", "ENGRAM_GOVERNANCE_TARGET"),
    )
    artifacts_addr: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['artifacts']}",
        validation_alias=AliasChoices("ENGRAM_ARTIFACTS_ADDR", "ENGRAM_ARTIFACTS_TARGET"),
    )
    compactor_addr: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['compactor']}",
        validation_alias=AliasChoices("ENGRAM_COMPACTOR_ADDR", "ENGRAM_COMPACTOR_TARGET"),
    )
    tls_ca: Path | None = Field(
        default=None, description="CA that signed the services' certificates; set, calls use TLS"
    )
    tls_cert: Path | None = Field(
        default=None, description="client certificate, for services that require mutual TLS"
    )
    tls_key: Path | None = Field(default=None, description="the client certificate's private key")
    timeout_seconds: float = 30.0

    @model_validator(mode="after")
    def _local_endpoints(self) -> ClientSettings:
        """Addresses not set in the environment come from `engram up`'s endpoints.json."""
        path = self.home / "endpoints.json"
        if not path.exists():
            return self
        try:
            endpoints = json.loads(path.read_text())
        except ValueError:
            return self
        for name, address in endpoints.items():
            field = f"{name}_addr"
            if field in type(self).model_fields and field not in self.model_fields_set:
                object.__setattr__(self, field, str(address))  # frozen model, set once here
        return self

    def tls(self) -> TlsFiles:
        """The TLS keyword arguments every client takes (``tls_ca``, ``tls_cert``, ``tls_key``)."""
        return TlsFiles(tls_ca=self.tls_ca, tls_cert=self.tls_cert, tls_key=self.tls_key)

    def admin_token_path(self) -> Path:
        return self.home / "auth" / "admin.token"

    def resolve_token(self) -> str:
        if self.token:
            return self.token
        path = self.admin_token_path()
        if path.exists():
            return path.read_text().strip()
        raise FileNotFoundError(f"no token: set ENGRAM_TOKEN or run `engram up` (it writes {path})")
