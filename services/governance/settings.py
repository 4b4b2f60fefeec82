"""Governance settings (``ENGRAM_GOVERNANCE_*``): the only place its store's location is known."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from services.common.settings import ServerSettings


class GovernanceSettings(ServerSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_GOVERNANCE_", frozen=True, extra="ignore", populate_by_name=True
    )

    port: int = 50052
    db_url: str | None = None
    """Default: sqlite under $ENGRAM_HOME/governance/governance.db."""
    migrate: bool = True
    def database_url(self) -> str:
        default = (self.data_dir("governance") / "governance.db").resolve()
        return self.db_url or f"sqlite:///{default}"
