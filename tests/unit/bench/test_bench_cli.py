"""`engram bench`: a benchmark that cannot run here says what to do, and stores nothing."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from engram.bench import chroma
from engram.bench._harness import BenchUnavailable
from engram.cli.main import app


@pytest.fixture
def no_chroma(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "chromadb" else real(name, *a)
    )


@pytest.mark.usefixtures("no_chroma")
def test_chroma_bench_without_chroma_says_how_to_install_it() -> None:
    with pytest.raises(BenchUnavailable, match="make compare-setup"):
        chroma.run(scale=0.1, progress=False)


@pytest.mark.usefixtures("no_chroma")
def test_cli_reports_a_missing_optional_dependency_as_an_error() -> None:
    result = CliRunner().invoke(app, ["bench", "chroma", "--scale", "0.1", "--json"])
    assert result.exit_code != 0
    assert "make compare-setup" in result.output


def test_cli_rejects_an_unknown_benchmark_with_the_choices() -> None:
    result = CliRunner().invoke(app, ["bench", "nosuch"])
    assert result.exit_code != 0
    assert "chroma" in result.output and "search" in result.output


def test_embedder_reaches_the_search_bench_and_no_other_but_fleet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from engram.bench import search

    seen: dict[str, object] = {}

    def run(**kwargs: object) -> dict[str, object]:
        seen.update(kwargs)
        return {"embedder": kwargs["embedder"]}

    monkeypatch.setattr(search, "run", run)
    result = CliRunner().invoke(app, ["bench", "search", "--embedder", "quality", "--json"])
    assert result.exit_code == 0, result.output
    assert seen["embedder"] == "quality"
    refused = CliRunner().invoke(app, ["bench", "gate", "--embedder", "quality"])
    assert refused.exit_code != 0
    assert "--embedder: only for `engram bench fleet` and `engram bench search`" in \
        refused.output
