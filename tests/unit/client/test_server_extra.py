"""Without the server extra the SDK and the client commands work, and a command that needs
the extra says which to install. (tests/integration/client checks it in a real venv.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVER_ONLY = ("services", "sqlalchemy", "alembic", "psycopg", "boto3", "prometheus_client",
               "pydantic_settings", "numpy", "tokenizers", "safetensors", "scipy", "usearch",
               "onnx", "onnxruntime", "cryptography", "grpc_health", "grpc_reflection",
               "grpc_status", "re2")
# Runs the CLI with the server's modules made unimportable, as in an install without the extra.
CLIENT_ONLY = f"""
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {set(SERVER_ONLY)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name.partition(".")[0])
sys.meta_path.insert(0, NotInstalled())
import engram.client
from engram.cli.main import main
sys.argv[0] = "engram"
main()
"""


def _engram(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", CLIENT_ONLY, *args], capture_output=True,
                          text=True, env=env, timeout=60, cwd=ROOT)


def test_every_client_command_shows_its_help() -> None:
    listing = _engram("--help")
    assert listing.returncode == 0, listing.stderr
    for group in ("add", "query", "search", "get", "list", "status", "snapshot", "verify",
                  "import", "gov", "artifacts", "runs", "events", "snapshots", "rehydrate",
                  "compactor", "up", "token", "bench", "eval"):
        assert f" {group} " in listing.stdout, group
    for command in (["search"], ["compactor", "record"], ["up"], ["token", "create"],
                    ["eval", "locomo"]):
        shown = _engram(*command, "--help")
        assert shown.returncode == 0, f"{command}: {shown.stderr}"
        # Help says what a command does for the user, not where the idea came from.
        assert "seed" not in shown.stdout.lower(), command


@pytest.mark.parametrize(("command", "name"), [
    (["up"], "engram up"),
    (["token", "create", "--agent", "a", "--fleet", "f"], "engram token create"),
    (["bench", "shard"], "engram bench"),
    (["eval", "locomo", "conversation.json"], "engram eval locomo"),
    # Any existing file: the key is needed before the bundle is opened.
    (["import-bundle", "pyproject.toml", "--reissue-ids", "k.key"],
     "engram import-bundle --reissue-ids"),
])
def test_a_server_command_names_the_extra_to_install(command: list[str], name: str) -> None:
    result = _engram(*command)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"`{name}` needs the server extra: pip install 'engram[server]'" in line

