"""The harness that starts servers for benches and fault tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engram.bench._harness import ServerProcess


def test_a_server_that_never_serves_is_stopped_not_left_running(tmp_path: Path) -> None:
    # A restarted governance whose chain check failed never reports SERVING: the fault test
    # that started it used to leave it running (a ResourceWarning in a later test).
    never = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], {},
                          timeout=1, log_path=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="did not become SERVING in 1"):
        never.__enter__()
    assert never.process is not None and never.process.poll() is not None
