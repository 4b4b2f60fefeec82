"""Run the shard service: `python -m services.shard` (settings from ENGRAM_SHARD_*)."""

from __future__ import annotations

import logging

from services.common.logging_setup import configure_logging
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings


def main() -> None:
    settings = ShardSettings()
    configure_logging("shard", settings.log_level)
    server, _service = build_shard_server(settings)
    server.start()
    logging.getLogger("engram.shard").info("shard ready", extra={"address": server.address})
    server.run_until_signalled()


if __name__ == "__main__":
    main()
