"""`engram export` on a full disk or into a missing directory: one error line (or JSON), no
traceback, nothing left behind (found by a review, 2026-11-29: both were tracebacks, and the
full disk left `<out>.partial` holding the fleet's rows)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from engram.bundle.format import BundleWriter
from engram.cli import bundle as bundle_cli
from engram.cli.main import app


def test_an_abort_on_a_full_disk_still_removes_the_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The abort's own close flushes the tar's end blocks and fails again on a full disk;
    before, that second error skipped the unlink."""
    with pytest.raises(OSError, match="No space"), \
            BundleWriter(tmp_path / "x.bundle", "f") as bundle:
        with bundle.part("records") as part:
            part.write({"id": "r0", "content": "a row of the fleet"})
        real_close = bundle._tar.close

        def full_disk() -> None:
            real_close()
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(bundle._tar, "close", full_disk)
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_export_into_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["export", "--fleet", "f", "-o",
                                      str(tmp_path / "absent" / "x.bundle")])
    assert result.exit_code == 2
    assert "is not a directory; create it or choose another -o" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("as_json", [False, True])
def test_a_full_disk_during_export_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               as_json: bool) -> None:
    def export(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    clients = SimpleNamespace(shard=SimpleNamespace(status=lambda: SimpleNamespace(
        total_records=1)), close=lambda: None)
    monkeypatch.setattr(bundle_cli, "open_clients", lambda _settings: clients)
    monkeypatch.setattr(bundle_cli, "cli_settings", lambda: None)
    monkeypatch.setattr(bundle_cli.Exporter, "export", export)
    result = CliRunner().invoke(app, ["export", "--fleet", "f", "-o",
                                      str(tmp_path / "x.bundle"), *(["--json"] * as_json)])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)  # an exit, not an escaped OSError
    message = ("the bundle could not be written or read: No space left on device")
    if as_json:
        assert json.loads(result.stdout)["error"]["message"] == message
    else:
        assert message in result.output
