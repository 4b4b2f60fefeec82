"""`pip install <checkout>` alone, in a fresh virtualenv: the SDK and the `engram` CLI work
against a running stack, nothing of the server is installed, and a server command says
which extra to install."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.test_readme_tour import _free_base

ROOT = Path(__file__).resolve().parents[3]
NOT_INSTALLED = ("sqlalchemy", "onnxruntime", "numpy", "cryptography", "pydantic_settings",
                 "grpc_status", "grpc_health", "boto3")


def _client_venv(tmp_path: Path) -> Path:
    """A new venv with the checkout installed as a user would: base dependencies only."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, checkout / name)
    for package in ("engram", "services"):  # copied, so the build leaves the tree untouched
        shutil.copytree(ROOT / package, checkout / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(checkout)],
        env=env, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return venv / "bin"


@contextmanager
def _stack(home: Path, cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """Governance and the shard from this checkout (the main environment has the extra)."""
    env = {**os.environ, "ENGRAM_HOME": str(home), "PYTHONPATH": str(ROOT),
           "ENGRAM_SHARD_EMBEDDER": "none", "COLUMNS": "120"}
    env.pop("ENGRAM_TOKEN", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "engram.cli.main", "up", "--only", "governance", "--only",
         "shard", "--base-port", str(_free_base())],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield up
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            raise


def _wait_ready(up: subprocess.Popen[str]) -> None:
    deadline, banner = time.monotonic() + 180, ""
    while "Ctrl-C stops everything" not in banner:
        assert up.poll() is None, f"engram up exited: {banner}{up.stdout.read()}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, banner
        banner += up.stdout.readline()  # type: ignore[union-attr]


@pytest.mark.slow
def test_client_installs_alone_and_talks_to_a_running_stack(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with _stack(home, work) as up:  # starts while the venv is built
        bin_dir = _client_venv(tmp_path)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "ENGRAM_TOKEN") and not k.startswith("ENGRAM_")}
        env.update(ENGRAM_HOME=str(home), COLUMNS="200")

        def engram(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(bin_dir / "engram"), *args], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=60)

        listing = engram("--help")
        assert listing.returncode == 0 and " add " in listing.stdout, listing.stderr
        probe = ("import importlib.util, sys, engram.client; "
                 f"print([m for m in {NOT_INSTALLED!r} if importlib.util.find_spec(m)]); "
                 "print(sorted(m for m in sys.modules if m.startswith('services')))")
        imported = subprocess.run([str(bin_dir / "python"), "-c", probe], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=60)
        assert imported.stdout.split("\n")[:2] == ["[]", "[]"], imported.stdout + imported.stderr
        for module in ("sqlalchemy", "onnxruntime"):
            missing = subprocess.run([str(bin_dir / "python"), "-c", f"import {module}"],
                                     cwd=work, env=env, capture_output=True, text=True)
            assert "ModuleNotFoundError" in missing.stderr, module
        assert engram("up", "--help").returncode == 0
        refused = engram("up")
        assert refused.returncode == 1
        assert "`engram up` needs the server extra: pip install 'engram[server]'" \
            in refused.stderr and len(refused.stderr.strip().splitlines()) == 1

        _wait_ready(up)
        added = engram("add", "Lesson learned: pin your dependencies", "--run", "run-1",
                       "--tags", "ops", "--json")
        assert added.returncode == 0, added.stderr
        record_id = json.loads(added.stdout)["id"]
        found = engram("query", "pin dependencies", "--json")
        assert found.returncode == 0, found.stderr
        assert [hit["id"] for hit in json.loads(found.stdout)] == [record_id]
        record = json.loads(engram("get", record_id, "--json").stdout)
        assert record["content"] == "Lesson learned: pin your dependencies"
        assert record["tags"] == ["ops"] and record["run_id"] == "run-1"
        listed = json.loads(engram("list", "--run", "run-1", "--json").stdout)
        assert [r["id"] for r in listed] == [record_id]
        status = json.loads(engram("status", "--json").stdout)
        assert status["total_records"] == 1  # an int64, printed as a number
        bad = engram("add", "too important", "--importance", "3")
        assert bad.returncode == 2 and "[IMPORTANCE_OUT_OF_RANGE]" in bad.stderr, bad.stderr
