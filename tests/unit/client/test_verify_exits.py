"""README: a verify command exits 0 when everything it was asked about is intact, 1 on an
integrity failure, 2 when it could not finish without finding one. Found in review
(2026-11-30): a forgotten argument or a missing token exited 1, and `events verify` exited 2
on a broken chain (its DATA_LOSS went out as a failed call), so a script read a typo as
tampering and tampering as an outage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.cli import _output as output
from engram.cli.main import app
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient

VERIFY_COMMANDS = [["verify", "rec-1"], ["artifacts", "verify"], ["events", "verify", "run-1"],
                   ["compactor", "verify", "run-1"], ["gov", "chain", "verify"]]


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An ENGRAM_HOME with no admin token, relative to the working directory; its token path."""
    monkeypatch.delenv("ENGRAM_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENGRAM_HOME", "nowhere")
    monkeypatch.setattr(output, "_settings", None)
    return tmp_path / "nowhere" / "auth" / "admin.token"


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, " ".join(result.output.split())  # stdout and stderr


@pytest.mark.parametrize("args", VERIFY_COMMANDS, ids=" ".join)
def test_a_verify_that_could_not_start_exits_2(no_token: Path, args: list[str]) -> None:
    code, said = _run(args)
    assert code == 2, said
    # the token it looked for, as an absolute path: ENGRAM_HOME is relative to where one runs
    assert f"no token: set ENGRAM_TOKEN, or run `engram up` (it writes {no_token};" in said


def test_a_verify_asked_about_nothing_exits_2(no_token: Path) -> None:
    code, said = _run(["verify"])
    assert (code, said) == (2, "error: give a record id or --all")


def test_events_verify_of_a_broken_chain_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: ArtifactsClient, run_id: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        raise EngramRpcError(grpc.StatusCode.DATA_LOSS, "event 3 of run-1 does not hash to its "
                             "stored hash", "CHAIN_BROKEN")
        yield  # a generator, as replay is

    monkeypatch.setattr(ArtifactsClient, "replay", broken)
    monkeypatch.setattr(ArtifactsClient, "get_run",
                        lambda self, run_id: apb.Run(run_id=run_id, event_count=3))
    monkeypatch.setenv("ENGRAM_TOKEN", "token")
    monkeypatch.setattr(output, "_settings", None)
    code, said = _run(["events", "verify", "run-1"])
    assert code == 1, said
    assert "chain broken: event 3 of run-1 does not hash to its stored hash [CHAIN_BROKEN]" \
        in said
