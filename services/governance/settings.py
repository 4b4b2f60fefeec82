"""Governance settings (``ENGRAM_GOVERNANCE_*``): the only place its store's location is known."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServerSettings
from services.governance.service import DEFAULT_ERASURE_BYTES_PER_DAY


class GovernanceSettings(ServerSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_GOVERNANCE_", frozen=True, extra="ignore", populate_by_name=True
    )

    port: int = 50052
    db_url: str | None = None
    """Default: sqlite under $ENGRAM_HOME/governance/governance.db."""
    migrate: bool = True
    erasure_bytes_per_day: int = Field(default=DEFAULT_ERASURE_BYTES_PER_DAY, ge=1)
    """A fleet's erasures recorded in 24 h (their chained state): governance cannot check that
    an erasure's items exist, and the chain keeps every erasure (RESOURCE_EXHAUSTED
    ERASURE_QUOTA beyond)."""
    max_receive_bytes: int | None = 64 * 1024 * 1024
    """A gate call carries a whole write batch and, for contradiction rules, each record's
    neighbours: more than one client request may hold (4 MiB by default)."""

    def database_url(self) -> str:
        default = (self.data_dir("governance") / "governance.db").resolve()
        return self.db_url or f"sqlite:///{default}"
