"""README: a verify command exits 0 when everything it was asked about is intact, 1 on an
integrity failure, 2 when it could not finish without finding one. Found in review
(2026-11-30): a forgotten argument or a missing token exited 1, and `events verify` exited 2
on a broken chain (its DATA_LOSS went out as a failed call), so a script read a typo as
tampering and tampering as an outage."""

from __future__ import annotations

import json
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
from engram.client.compactor import CompactorClient
from engram.compactor.v1 import compactor_service_pb2 as cpb

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


def test_a_checkpoint_head_without_its_length_is_a_command_line_mistake(no_token: Path) -> None:
    """With --since-head alone the length was 0, which only the genesis head extends: the
    command reported the history rewritten and exited 1, tampering (found in review)."""
    for args in (["--since-head", "ab" * 32], ["--since-length", "7"]):
        code, said = _run(["gov", "chain", "verify", *args])
        assert code == 2, said
        assert "--since-head and --since-length go together" in said


def test_compactor_verify_that_could_not_ask_governance_exits_2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """README: 2 when some tombstones could not be confirmed; it exited 0 (found in review)."""
    monkeypatch.setattr(CompactorClient, "verify", lambda self, run_id: cpb.VerifyRunResponse(
        ok=True, lines_checked=3, tombstoned=1, tombstones_unconfirmed=1))
    monkeypatch.setenv("ENGRAM_TOKEN", "token")
    monkeypatch.setattr(output, "_settings", None)
    code, said = _run(["compactor", "verify", "run-1"])
    assert code == 2, said
    assert "could not be checked against governance" in said


@pytest.mark.parametrize("as_json", [False, True])
def test_events_verify_of_a_broken_chain_exits_1(monkeypatch: pytest.MonkeyPatch,
                                                 as_json: bool) -> None:
    def broken(self: ArtifactsClient, run_id: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        raise EngramRpcError(grpc.StatusCode.DATA_LOSS, "event 3 of run-1 does not hash to its "
                             "stored hash", "CHAIN_BROKEN")
        yield  # a generator, as replay is

    monkeypatch.setattr(ArtifactsClient, "replay", broken)
    monkeypatch.setattr(ArtifactsClient, "get_run",
                        lambda self, run_id: apb.Run(run_id=run_id, event_count=3))
    monkeypatch.setenv("ENGRAM_TOKEN", "token")
    monkeypatch.setattr(output, "_settings", None)
    if as_json:  # what a script parses: the answer on stdout, as before
        result = CliRunner().invoke(app, ["events", "verify", "run-1", "--json"])
        assert result.exit_code == 1, result.output
        answer = json.loads(result.stdout)
        assert (answer["intact"], answer["error"]["reason"]) == (False, "CHAIN_BROKEN")
        return
    code, said = _run(["events", "verify", "run-1"])
    assert code == 1, said
    assert "chain broken: event 3 of run-1 does not hash to its stored hash [CHAIN_BROKEN]" \
        in said


def test_a_verify_that_fails_on_something_unexpected_exits_2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception no handler names (a bug, a broken pipe) exited 1, tampering to a script."""
    def broken(self: CompactorClient, run_id: str) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(CompactorClient, "verify", broken)
    monkeypatch.setenv("ENGRAM_TOKEN", "token")
    monkeypatch.setattr(output, "_settings", None)
    code, said = _run(["compactor", "verify", "run-1"])
    assert code == 2, said
    assert "RuntimeError: a bug" in said  # the traceback, on stderr
