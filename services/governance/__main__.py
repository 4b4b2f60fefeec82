"""Run governance: `python -m services.governance` (settings from ENGRAM_GOVERNANCE_*)."""

from __future__ import annotations

from services.common.logging_setup import configure_logging
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings


def main() -> None:
    settings = GovernanceSettings()
    configure_logging("governance", settings.log_level)
    server, _repository = build_governance_server(settings)
    server.start()
    server.run_until_signalled()


if __name__ == "__main__":
    main()
