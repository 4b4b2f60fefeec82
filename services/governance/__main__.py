"""Run governance: `python -m services.governance` (settings from ENGRAM_GOVERNANCE_*)."""

from __future__ import annotations

from services.common.startup import run_service
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings


def main() -> None:
    run_service("governance", GovernanceSettings, build_governance_server)


if __name__ == "__main__":
    main()
