"""`engram gateway`: its options, and a missing extra said plainly."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from engram.cli.main import app


def test_help_names_the_options() -> None:
    result = CliRunner().invoke(app, ["gateway", "--help"])
    assert result.exit_code == 0
    assert "--host" in result.output and "--port" in result.output


def test_without_the_extra_it_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "engram.gateway" or n.startswith(
            ("engram.gateway.", "starlette"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)
    result = CliRunner().invoke(app, ["gateway", "--port", "0"])
    assert result.exit_code == 1
    assert "engram[gateway]" in result.output


def test_the_route_table_in_the_docs_is_generated_from_the_annotations() -> None:
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, str(root / "tools" / "gen_gateway_routes.py"),
                             "--check"], capture_output=True, text=True, check=False,
                            cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr


def _captured(monkeypatch: pytest.MonkeyPatch) -> tuple[list[object], list[object]]:
    """The GatewayConfig each `engram gateway` run builds, and the apps it would have served
    (uvicorn is not started)."""
    import uvicorn

    from engram.gateway import _serve

    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda asgi, **_kw: served.append(asgi))
    made: list[object] = []
    real = _serve.Gateway
    monkeypatch.setattr(_serve, "Gateway", lambda config: made.append(config) or real(config))
    return made, served


def test_the_limit_flags_reach_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    made, served = _captured(monkeypatch)
    result = CliRunner().invoke(app, ["gateway", "--port", "0", "--body-min-rate", "0",
                                      "--uploads-per-token", "3", "--stream-min-rate", "5"])
    assert result.exit_code == 0, result.output
    config = made[0]
    assert (config.body_min_bytes_per_s, config.uploads_per_token,  # type: ignore[attr-defined]
            config.stream_min_bytes_per_s) == (0, 3, 5)  # type: ignore[attr-defined]
    assert served
    # Defaults when the flags are not given.
    made.clear()
    assert CliRunner().invoke(app, ["gateway", "--port", "0"]).exit_code == 0
    assert (made[0].body_min_bytes_per_s, made[0].uploads_per_token,  # type: ignore[attr-defined]
            made[0].stream_min_bytes_per_s) == (16384, 8, 16384)  # type: ignore[attr-defined]
    refused = CliRunner().invoke(app, ["gateway", "--uploads-per-token", "0"])
    assert refused.exit_code == 2 and "uploads-per-token" in refused.output


@pytest.mark.parametrize("flag", ["--body-min-rate", "--stream-min-rate"])
@pytest.mark.parametrize("value", ["1e-320", "0.5", "nan", "inf", "-1"])
def test_a_rate_that_would_switch_its_guard_off_is_refused(flag: str, value: str) -> None:
    """Found in review: 1e-320 bytes/s made every byte worth more waiting than a float holds
    (the guard off, silently); nan and inf likewise. Exit 2, naming the flag, before anything
    is served. Checked failing without the check (1e-320, 0.5, nan and inf were served)."""
    import uvicorn

    served: list[object] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uvicorn, "run", lambda asgi, **_kw: served.append(asgi))
        result = CliRunner().invoke(app, ["gateway", "--port", "0", flag, value])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # rich wraps it in a box
    assert flag in said and not served
    assert f"must be 0 (off) or a finite number of bytes a second of at least 1, got {value}" \
        in said


def test_rates_of_0_and_1_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda asgi, **_kw: None)
    for value in ("0", "1", "1e9"):
        result = CliRunner().invoke(app, ["gateway", "--port", "0", "--body-min-rate", value,
                                          "--stream-min-rate", value])
        assert result.exit_code == 0, (value, result.output)


def test_the_cap_on_uploads_reaches_the_gateway_and_keeps_threads_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--uploads-max (default 24) reaches the config; more than 24 (8 of the 32 upload threads
    stay free) or 0 is exit 2."""
    made, _served = _captured(monkeypatch)
    assert CliRunner().invoke(app, ["gateway", "--port", "0"]).exit_code == 0
    assert made[-1].uploads_max == 24  # type: ignore[attr-defined]
    result = CliRunner().invoke(app, ["gateway", "--port", "0", "--uploads-max", "3"])
    assert result.exit_code == 0, result.output
    assert made[-1].uploads_max == 3  # type: ignore[attr-defined]
    for value in ("25", "0"):
        refused = CliRunner().invoke(app, ["gateway", "--uploads-max", value])
        assert refused.exit_code == 2 and "uploads-max" in refused.output


def test_the_upload_answer_timeout_reaches_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    """--upload-answer-timeout (default 300 s) reaches the config; 0, a negative number, nan
    and inf are exit 2, naming the flag, before anything is served."""
    made, served = _captured(monkeypatch)
    assert CliRunner().invoke(app, ["gateway", "--port", "0"]).exit_code == 0
    assert made[-1].upload_answer_seconds == 300.0  # type: ignore[attr-defined]
    result = CliRunner().invoke(app, ["gateway", "--port", "0", "--upload-answer-timeout", "12"])
    assert result.exit_code == 0, result.output
    assert made[-1].upload_answer_seconds == 12.0  # type: ignore[attr-defined]
    served.clear()
    for value in ("0", "-1", "nan", "inf"):
        refused = CliRunner().invoke(app, ["gateway", "--upload-answer-timeout", value])
        said = " ".join(refused.output.replace("│", " ").split())
        assert refused.exit_code == 2 and "--upload-answer-timeout" in said, (value, said)
        assert "must be a positive number of seconds" in said
    assert not served


def test_the_header_timeout_reaches_uvicorn_and_a_bad_one_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--header-timeout (default 10 s) is the protocol uvicorn serves with; 0, a negative
    number, nan and inf are exit 2 before anything is served (so are they for `engram mcp`,
    with --body-timeout)."""
    import uvicorn

    protocols: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda asgi, **kw: protocols.append(kw["http"]))
    result = CliRunner().invoke(app, ["gateway", "--port", "0", "--header-timeout", "2.5"])
    assert result.exit_code == 0, result.output
    assert protocols and protocols[-1].__name__ == "HeaderTimedProtocol"  # type: ignore[attr-defined]
    protocols.clear()
    for command in (["gateway", "--header-timeout"], ["mcp", "--transport", "http",
                                                      "--header-timeout"],
                    ["mcp", "--transport", "http", "--body-timeout"]):
        for value in ("0", "-1", "nan", "inf"):
            refused = CliRunner().invoke(app, [*command, value])
            said = " ".join(refused.output.replace("│", " ").split())
            assert refused.exit_code == 2, (command, value, said)
            assert "must be a positive number of seconds" in said, (command, value, said)
    assert not protocols
