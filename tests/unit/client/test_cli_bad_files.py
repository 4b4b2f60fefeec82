"""A file the CLI reads that is not what it should be (gzipped, binary, not a key) is one
error line naming it and exit 1, never a traceback (found in review, 2026-11-30: `engram
import file.jsonl.gz` printed a UnicodeDecodeError traceback, `token create --key wrong.pem` a
ValueError one)."""

from __future__ import annotations

import gzip
from pathlib import Path

from typer.testing import CliRunner

from engram.cli.main import app


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    # an exception the command did not turn into its own exit is kept here (a traceback)
    assert isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_a_file_that_is_not_utf8_text_is_named_in_one_line(tmp_path: Path) -> None:
    packed = tmp_path / "memories.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"content": "a"}\n'))
    code, output = _run("import", str(packed))
    assert code == 1, output
    assert f"cannot read {packed}: not UTF-8 text" in output
    assert "JSON Lines" in output


def test_a_key_file_that_is_not_a_signing_key_is_named_in_one_line(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.pem"
    wrong.write_text("not a key\n")
    code, output = _run("token", "create", "--agent", "a1", "--fleet", "f1", "--key", str(wrong))
    assert code == 1, output
    assert f"cannot load the signing key {wrong}" in output
    assert "Ed25519 private key" in output
