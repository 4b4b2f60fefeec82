"""README promises about switches and defaults that no other test held: `make help` lists the
targets, tracing is off unless an OTLP endpoint is set, and revocations are refreshed every
2 s by default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.artifacts.settings import ArtifactsSettings
from services.compactor.settings import CompactorSettings
from services.embedder.settings import EmbedderSettings
from services.governance.settings import GovernanceSettings
from services.shard.settings import ShardSettings

ROOT = Path(__file__).resolve().parents[2]


def test_make_help_lists_every_phony_target_the_readme_names() -> None:
    listed = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=30, check=True).stdout
    names = {line.split()[0] for line in listed.splitlines() if line.strip()}
    assert {"setup", "protos", "lint", "bench", "lock", "clean", "up", "test"} <= names
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert phony is not None
    assert set(phony.group(1).split()) == names  # a target without a help line is a gap
    assert "$$" not in listed  # the Makefile's escaping is not shown to a reader


def _tracing(endpoint: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    code = ("from opentelemetry import trace\n"
            "from services.common.tracing import configure_tracing\n"
            "print(configure_tracing('shard'), type(trace.get_tracer_provider()).__name__)\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


def test_tracing_is_off_unless_an_otlp_endpoint_is_set() -> None:
    assert _tracing(None) == "False ProxyTracerProvider"
    assert _tracing("  ") == "False ProxyTracerProvider"
    # loopback, and no span is made: nothing is sent
    assert _tracing("http://127.0.0.1:4317") == "True TracerProvider"


@pytest.mark.parametrize("settings", [ShardSettings, GovernanceSettings, ArtifactsSettings,
                                      CompactorSettings, EmbedderSettings])
def test_revocations_and_suspensions_are_refreshed_every_2_s_by_default(
        settings: type, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_AUTH_RESTRICTIONS_REFRESH_SECONDS", raising=False)
    assert settings().auth_restrictions_refresh_seconds == 2.0
    monkeypatch.setenv("ENGRAM_AUTH_RESTRICTIONS_REFRESH_SECONDS", "0.5")
    assert settings().auth_restrictions_refresh_seconds == 0.5


def test_the_shards_search_defaults_are_the_readmes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("ENGRAM_SHARD_")]:
        monkeypatch.delenv(name)
    shard = ShardSettings()
    assert (shard.embedder, shard.embed_threads, shard.embed_process) == ("minilm", 2, True)
    assert shard.index_niceness == 10
    assert (shard.dedup, shard.dedup_similarity) == ("exact", 0.97)


def test_the_default_embedder_is_all_minilm_l6_v2_run_as_int8(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """README: "semantic is all-MiniLM-L6-v2 (...) run on ONNX Runtime as int8"; `minilm-fp32`
    is the same model unquantized."""
    from services.shard.server import embedder_spec

    for name in [k for k in os.environ if k.startswith("ENGRAM_SHARD_")]:
        monkeypatch.delenv(name)
    chosen = embedder_spec(ShardSettings())
    assert chosen is not None
    spec, int8 = chosen
    assert (spec.name, spec.hidden, spec.layers, int8) == ("all-MiniLM-L6-v2", 384, 6, True)
    monkeypatch.setenv("ENGRAM_SHARD_EMBEDDER", "minilm-fp32")
    fp32 = embedder_spec(ShardSettings())
    assert fp32 is not None and fp32[0].digest == spec.digest and fp32[1] is False


@pytest.mark.parametrize("settings", [ShardSettings, GovernanceSettings, ArtifactsSettings,
                                      CompactorSettings, EmbedderSettings])
def test_engram_home_is_dot_engram_unless_set(settings: type,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """README: `make up` keeps everything under `$ENGRAM_HOME` (default `./.engram`): the
    services and the CLI (`engram up` takes its home from the client settings) agree."""
    from engram.client import ClientSettings

    monkeypatch.delenv("ENGRAM_HOME", raising=False)
    assert settings().home == Path(".engram") == ClientSettings().home
    monkeypatch.setenv("ENGRAM_HOME", "/srv/engram")
    assert settings().home == Path("/srv/engram") == ClientSettings().home


@pytest.mark.parametrize("value", ["exactt", "SEMANTIC ", "on", ""])
def test_a_dedup_mode_the_readme_does_not_name_is_refused(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: any other value of ENGRAM_SHARD_DEDUP was taken, and behaved as exact."""
    from pydantic import ValidationError

    monkeypatch.setenv("ENGRAM_SHARD_DEDUP", value)
    with pytest.raises(ValidationError, match="dedup"):
        ShardSettings()
