"""An `engram import-bundle` process SIGKILLed half-way through a run's event chain (sent in
three calls; killed once the first has landed, so at most one more lands after it) leaves a
prefix of the chain that verifies, and running the same import again finishes
it: the target then exports the same carried parts as the origin. The in-process interruption
tests (test_round_trip.py) raise an exception; a kill runs no cleanup at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engram.client.artifacts import ArtifactsClient
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for, populated_origin
from tests.integration.bundle.test_round_trip import CARRIED, members
from tests.stack import FullStack, full_stack

EVENTS = 400
ENGRAM = str(Path(sys.executable).parent / "engram")


def _import(stack: FullStack, token: str, home: Path, bundle: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update({f"ENGRAM_{name.upper()}_ADDR": address
                for name, address in stack.addresses().items()},
               ENGRAM_TOKEN=token, ENGRAM_HOME=str(home))
    return subprocess.Popen([ENGRAM, "import-bundle", str(bundle), "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_an_import_killed_in_a_run_s_chain_resumes_when_run_again(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", "fleet-a", ADMIN)
    bundle, again = tmp_path / "origin.bundle", tmp_path / "target.bundle"
    with populated_origin(tmp_path, engram_home, make_token) as origin:
        with ArtifactsClient(origin.artifacts.address, make_token("scout-1", "fleet-a")) as art:
            art.start_run("run-long", {"goal": "a chain worth cutting"})
            for n in range(EVENTS):  # 8 MB: three ImportRunItems calls of 3 MiB at most
                art.append_event("run-long", "step", {"n": n, "log": "x" * 20_000})
        with cli_for(origin, admin, monkeypatch) as run:
            run("export", "--fleet", "fleet-a", "-o", str(bundle))

    with full_stack(tmp_path / "b", engram_home, make_token) as target:
        with ArtifactsClient(target.artifacts.address, admin) as art:
            importing = _import(target, admin, engram_home, bundle)
            try:
                cut = 0
                deadline = time.monotonic() + 120
                while not cut and time.monotonic() < deadline:
                    assert importing.poll() is None, importing.communicate()
                    try:
                        cut = art.get_run("run-long").event_count
                    except Exception:  # not imported yet
                        time.sleep(0.005)
                importing.send_signal(signal.SIGKILL)
            finally:
                importing.communicate(timeout=30)  # reaped, its pipes closed
            assert importing.returncode == -signal.SIGKILL
            # A call the importer had sent before it died still runs to its end in the server
            # (this process): read the chain once it has stopped growing for a second.
            left, steady = art.get_run("run-long").event_count, time.monotonic()
            while time.monotonic() - steady < 1.0:
                time.sleep(0.1)
                now = art.get_run("run-long").event_count
                if now != left:
                    left, steady = now, time.monotonic()
            assert 0 < left < EVENTS, left  # killed inside the chain
            assert not art.verify("run-long").problems
            assert len(list(art.replay("run-long"))) == left  # the prefix re-hashes

            finished = _import(target, admin, engram_home, bundle)
            out, err = finished.communicate(timeout=300)
            assert finished.returncode == 0, err
            report = json.loads(out)
            assert report["created"]["events"] + report["already_present"]["events"] \
                == EVENTS + 3  # run-1's three and run-long's
            assert report["already_present"]["events"] >= left
            assert art.get_run("run-long").event_count == EVENTS
        with cli_for(target, admin, monkeypatch) as run:
            run("export", "--fleet", "fleet-a", "-o", str(again))
    origin_parts, target_parts = members(bundle), members(again)
    for path in CARRIED:
        assert origin_parts[path] == target_parts[path], path
