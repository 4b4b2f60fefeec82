"""`engram bench scale` end to end on a small store: records spread over fleets, the restart
loads the index snapshot, and a kept store refuses another fleet count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engram.cli.main import app

pytestmark = pytest.mark.timeout(240)


def _scale(home: Path, fleets: int) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bench", "scale", "--records", "2000", "--scale", "0.02",
                                      "--fleets", str(fleets), "--home", str(home), "--json"])
    return result.exit_code, result.output


def test_a_small_scale_run_over_three_fleets_restarts_from_its_snapshot(
    tmp_path: Path,
) -> None:
    code, output = _scale(tmp_path, 3)
    assert code == 0, output
    figures = json.loads(output)
    assert figures["fleets"] == 3 and figures["records"] == 2000
    assert 0 < figures["lexical_p50_ms_at_2000"] <= figures["lexical_p95_ms_at_2000"]
    assert figures["restart_to_serving_s"] <= figures["restart_to_first_search_s"]
    assert figures["snapshot_bytes_per_record"] > 0 and figures["rss_bytes_per_record"] > 0
    assert (tmp_path / "shard" / "lexical-index.snapshot").exists()

    code, output = _scale(tmp_path, 5)  # the kept store was spread over 3
    assert code != 0
    assert "3 fleet(s)" in output and "--fleets 3" in output

    code, output = _scale(tmp_path, 3)  # reused: nothing written, the records all there
    assert code == 0, output
    assert json.loads(output)["records"] == 2000
