"""Every service reports a start-up failure the same way: one line naming the cause, exit 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TokenFactory

SERVICES = ("shard", "governance", "artifacts", "compactor")


def _start(service: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    environ.update({"ENGRAM_HOME": str(home), "ENGRAM_SHARD_ALLOW_UNGATED": "true"}, **env)
    return subprocess.run([sys.executable, "-m", f"services.{service}"], env=environ,
                          capture_output=True, text=True, timeout=60, check=False)


def _one_error_line(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [json.loads(line) for line in result.stderr.splitlines()
              if line.startswith("{") and json.loads(line)["level"] == "error"]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.mark.parametrize("service", SERVICES)
def test_a_setting_that_does_not_parse_is_named(service: str, tmp_path: Path,
                                                engram_home: Path) -> None:
    variable = f"ENGRAM_{service.upper()}_PORT"
    error = _one_error_line(_start(service, engram_home, **{variable: "not-a-port"}))
    assert variable in str(error["msg"])


@pytest.mark.parametrize("service", SERVICES)
def test_a_port_taken_is_named(service: str, tmp_path: Path, engram_home: Path,
                               make_token: TokenFactory) -> None:
    token = tmp_path / "service.token"
    token.write_text(make_token("svc-compactor", "system", ("service",)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        error = _one_error_line(_start(service, engram_home, **{
            f"ENGRAM_{service.upper()}_PORT": str(port),
            f"ENGRAM_{service.upper()}_DB_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE": str(token)}))
    assert str(port) in str(error["msg"])
