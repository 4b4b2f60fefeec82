"""`engram up` runs all four services, and the README's tour works as written against them."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tour() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Tour", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "README has no bash block under ## Tour"
    return match.group(1)


def _free_base() -> int:
    for _ in range(100):
        # Below Linux's ephemeral range (32768-60999): a port found free there can be taken
        # as the local port of any outgoing connection before `engram up` binds it.
        base = random.randint(20_000, 32_700)
        ports = [base + i for i in range(4)] + [base + 10 + i for i in range(4)]
        try:
            for port in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


@pytest.mark.slow
def test_make_up_topology_and_readme_tour(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {
        **os.environ,
        "ENGRAM_HOME": str(home),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "COLUMNS": "120",
    }
    env.pop("ENGRAM_TOKEN", None)
    up = subprocess.Popen(
        [str(BIN / "engram"), "up", "--base-port", str(_free_base())],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        banner = ""
        while "Ctrl-C stops everything" not in banner:
            assert up.poll() is None, f"engram up exited: {banner}{up.stdout.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, banner
            banner += up.stdout.readline()  # type: ignore[union-attr]
        for service in ("shard", "governance", "artifacts", "compactor"):
            assert service in banner
        work = tmp_path / "work"
        work.mkdir()
        tour = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", _tour()],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert tour.returncode == 0, tour.stdout[-4000:] + tour.stderr[-4000:]
        out = tour.stdout
        assert "stored" in out and "checked" in out and "all intact" in out
        assert "every one allowed" in out  # engram verify --gate
        assert "imported 2 records: 2 new" in out
        assert "chain intact" in out
        # the suspended agent's record no longer surfaces (the only place its text could appear)
        assert "suspended" in out
        assert "ship the artifact service" not in out
        # README: everything under $ENGRAM_HOME: one SQLite file per service, blobs under
        # artifacts/blobs, logs under logs/, the signing key and the CLI's admin token in auth/
        for service in ("shard", "governance", "artifacts", "compactor"):
            assert (home / service / f"{service}.db").is_file(), service
            assert (home / "logs" / f"{service}.log").is_file(), service
        assert (home / "artifacts" / "blobs").is_dir()  # the tour's one upload is forgotten
        assert {"signing.key", "signing.pub", "admin.token"} <= {
            p.name for p in (home / "auth").iterdir()}
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            rest, _ = up.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            raise
    assert up.returncode == 0, rest
    assert "all services stopped" in rest
