"""`engram front-config` and engram/front.py: the configuration made, and bad input refused
before anything is written."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.rpc import error_details_pb2, status_pb2
from typer.testing import CliRunner

from engram.cli.main import app
from engram.front import FrontConfigError, FrontLimits, refusal_details, render
from tests.front import nginx_check


def test_the_refusal_carries_the_services_own_reason_and_retry_delay() -> None:
    raw = refusal_details(FrontLimits(10, 3, 1250))
    status = status_pb2.Status.FromString(base64.b64decode(raw + "=" * (-len(raw) % 4)))
    assert status.code == 8
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and status.details[1].Unpack(retry)
    assert (info.reason, info.domain) == ("OVERLOADED", "engram.dev")
    assert dict(info.metadata) == {"limit": "front proxy", "max_in_flight": "10",
                                   "per_caller_in_flight": "3"}
    assert retry.retry_delay.ToMilliseconds() == 1250


def test_the_limits_are_in_the_configuration() -> None:
    text = render("10.0.0.7:50051", "0.0.0.0:50061", FrontLimits(12, 5))
    assert "limit_conn engram_all 12;" in text
    assert "limit_conn engram_caller 5;" in text
    assert "server 10.0.0.7:50051;" in text
    assert "listen 0.0.0.0:50061 http2;" in text
    assert "client_max_body_size 0;" in text


@pytest.mark.parametrize(("upstream", "listen", "limits", "words"), [
    ("127.0.0.1", "0.0.0.0:1", FrontLimits(), "--upstream must be HOST:PORT"),
    ("127.0.0.1:0", "0.0.0.0:1", FrontLimits(), "port from 1 to 65535"),
    ("127.0.0.1:70000", "0.0.0.0:1", FrontLimits(), "port from 1 to 65535"),
    ("shard;evil:1", "0.0.0.0:1", FrontLimits(), "neither an IP address nor a host name"),
    ("a b:1", "0.0.0.0:1", FrontLimits(), "neither an IP address nor a host name"),
    ("127.0.0.1:1", "}:1", FrontLimits(), "--listen"),
    ("127.0.0.1:1", "0.0.0.0:1", FrontLimits(0, 1), "--max-in-flight must be at least 1"),
    ("127.0.0.1:1", "0.0.0.0:1", FrontLimits(4, 5), "--per-caller-in-flight must be from 1"),
    ("127.0.0.1:1", "0.0.0.0:1", FrontLimits(4, 0), "--per-caller-in-flight must be from 1"),
    ("127.0.0.1:1", "0.0.0.0:1", FrontLimits(4, 2, 0), "--retry-after-ms"),
])
def test_bad_input_is_refused_naming_the_option(upstream: str, listen: str,
                                                limits: FrontLimits, words: str) -> None:
    with pytest.raises(FrontConfigError, match=words):
        render(upstream, listen, limits)


def test_ipv6_and_host_names_are_accepted() -> None:
    assert "server [::1]:50051;" in render("[::1]:50051", "127.0.0.1:1", FrontLimits())
    assert "server engram-shard.engram.svc:50051;" in render(
        "engram-shard.engram.svc:50051", "127.0.0.1:1", FrontLimits())


@pytest.mark.parametrize("state_dir", ["tmp", "/tmp/a b", "/tmp/x;y", "/tmp/$x", '/tmp/"'])
def test_a_state_dir_that_could_break_the_configuration_is_refused(state_dir: str) -> None:
    with pytest.raises(FrontConfigError, match="--state-dir"):
        render("127.0.0.1:1", "127.0.0.1:2", FrontLimits(), state_dir=state_dir)


def test_nginx_accepts_the_configuration(tmp_path: Path) -> None:
    checked = nginx_check(render("127.0.0.1:50051", "127.0.0.1:50061", FrontLimits(),
                                 state_dir=str(tmp_path)), tmp_path)
    assert checked.returncode == 0, checked.stderr


def test_the_command_prints_or_writes_it_and_refuses_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    printed = runner.invoke(app, ["front-config", "--max-in-flight", "9"])
    assert printed.exit_code == 0, printed.output
    assert "limit_conn engram_all 9;" in printed.output
    out = tmp_path / "front.conf"
    written = runner.invoke(app, ["front-config", "--out", str(out)])
    assert written.exit_code == 0, written.output
    assert out.read_text() == render("127.0.0.1:50051", "0.0.0.0:50061", FrontLimits())
    assert out.stat().st_mode & 0o777 == 0o644
    as_json = runner.invoke(app, ["front-config", "--json", "--out", str(out)])
    assert json.loads(as_json.stdout) == {"config": out.read_text(), "path": str(out)}
    refused = runner.invoke(app, ["front-config", "--per-caller-in-flight", "99",
                                  "--out", str(tmp_path / "no.conf")])
    assert refused.exit_code == 2
    assert "--per-caller-in-flight must be from 1 to --max-in-flight (16), got 99" in (
        refused.output)
    assert not list(tmp_path.glob("no.conf*"))
    unwritable = runner.invoke(app, ["front-config", "--out", str(tmp_path / "no" / "x.conf")])
    assert unwritable.exit_code == 1
    assert "cannot write" in unwritable.output


def test_the_configuration_is_the_same_bytes_in_every_process() -> None:
    """The refusal's ErrorInfo metadata is a protobuf map: serialized in hash order it made a
    new configuration (so a new ConfigMap name, so a restart of every shard pod) whenever it
    was generated again (found by the sidecar's author)."""
    made = {subprocess.run(
        [sys.executable, "-c", "from engram.front import FrontLimits, render; "
         "print(render('127.0.0.1:1', '127.0.0.1:2', FrontLimits()))"],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
        for seed in range(6)}
    assert len(made) == 1


def test_requests_nginx_refuses_after_choosing_the_location_are_mapped_too() -> None:
    """A location's own error_page list replaces the server's: a 400 raised inside `location /`
    (a body shorter than its content-length, seen with a raw HTTP/2 client in review) reached
    gRPC clients as a bare HTTP 400, i.e. INTERNAL. And nginx drops header names with '_'
    unless told otherwise, so metadata the service would see went missing."""
    text = render("127.0.0.1:1", "127.0.0.1:2", FrontLimits())
    location = text.split("location / {", 1)[1].split("}", 1)[0]
    assert "error_page 400 = @engram_bad_request;" in location
    assert "underscores_in_headers on;" in text
