"""`engram bench fleet`: ratios, operation choice, percentiles, error counting, the CLI."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from engram.bench import fleet
from engram.bench._harness import free_port
from engram.bench.fleet import (
    OPERATIONS,
    FleetParams,
    OperationPicker,
    Tally,
    operation_weights,
    summarize,
)
from engram.cli.main import app


def test_ratios_are_weights_normalised_in_operation_order_without_zeros() -> None:
    weights = operation_weights({"search": 3, "write": 1, "snapshot": 0})
    assert list(weights) == ["write", "search"]
    assert weights == {"write": 0.25, "search": 0.75}
    assert sum(operation_weights(fleet.DEFAULT_RATIOS).values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("ratios", "message"),
    [
        ({"write": 0, "search": 0}, "at least one ratio"),
        ({"write": -1, "search": 1}, "must not be negative"),
        ({"delete": 1}, "unknown operation"),
    ],
)
def test_ratios_that_select_nothing_or_nonsense_are_refused(
    ratios: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        operation_weights(ratios)


def test_the_picker_draws_operations_in_proportion_and_never_a_disabled_one() -> None:
    weights = operation_weights({"write": 5, "search": 3, "iteration": 2})
    picker = OperationPicker(weights, random.Random(3))
    drawn = Counter(picker.pick() for _ in range(20_000))
    assert set(drawn) == {"write", "search", "iteration"}
    for operation, share in weights.items():
        assert drawn[operation] / 20_000 == pytest.approx(share, abs=0.015)


def test_the_same_seed_draws_the_same_sequence() -> None:
    weights = operation_weights(fleet.DEFAULT_RATIOS)
    a, b, c = (OperationPicker(weights, random.Random(seed)) for seed in (9, 9, 10))
    drawn = [a.pick() for _ in range(500)]
    assert drawn == [b.pick() for _ in range(500)]
    assert drawn != [c.pick() for _ in range(500)]
    assert set(drawn) == set(OPERATIONS)


def test_summary_has_rates_percentiles_and_errors_by_code_across_agents() -> None:
    one, two = Tally(), Tally()
    for ms in range(1, 101):  # 1..100 ms
        (one if ms % 2 else two).ok("write", ms / 1000)
    one.ok("search", 0.004)
    one.failed("write", "UNAVAILABLE")
    two.failed("write", "UNAVAILABLE")
    two.failed("snapshot", "SNAPSHOT_SHORT")
    merged = Tally()
    merged.merge(one)
    merged.merge(two)
    figures = summarize(merged, elapsed_s=10.0)
    assert figures["ops"] == 101
    assert figures["failed"] == 3
    assert figures["ops_per_s"] == 10.1
    assert figures["errors"] == {"UNAVAILABLE": 2, "SNAPSHOT_SHORT": 1}
    latency = figures["latency_ms"]
    assert isinstance(latency, dict)
    assert latency["write"] == {"p50": 51.0, "p95": 95.0, "p99": 99.0}
    assert latency["search"] == {"p50": 4.0, "p95": 4.0, "p99": 4.0}
    assert "snapshot" not in latency  # it never succeeded: no latency to report
    operations = figures["operations"]
    assert isinstance(operations, dict)
    assert list(operations) == ["write", "search", "snapshot"]
    assert operations["snapshot"] == {"ok": 0, "failed": 1, "ops_per_s": 0.0,
                                      "errors": {"SNAPSHOT_SHORT": 1}}
    assert figures["ops_per_s_by_operation"] == {"write": 10.0, "search": 0.1, "snapshot": 0.0}


def test_params_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="fleets"):
        FleetParams(agents=2, fleets=3).check()
    with pytest.raises(ValueError, match="db"):
        FleetParams(db="mysql").check()


def _dead_stack() -> fleet.Stack:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: every call fails UNAVAILABLE
    return fleet.Stack({name: dead for name in fleet.SERVICES}, lambda a, f: "egt1.x.y", "dead")


def test_an_agent_counts_failed_calls_by_code_and_keeps_going() -> None:
    agent = fleet.Agent(0, "bench-fleet-0", "egt1.x.y", _dead_stack(),
                        operation_weights(fleet.DEFAULT_RATIOS), seed=1)
    try:
        # Each failed call is retried by gRPC first (4 more attempts over about 0.75 s).
        agent.loop(time.monotonic() + 3.0, fleet.threading.Event())
    finally:
        agent.close()
    assert not agent.tally.samples
    assert set(agent.tally.errors) == {fleet.START_RUN}
    assert agent.tally.errors[fleet.START_RUN]["UNAVAILABLE"] >= 2  # retried, not crashed


def test_cli_help_explains_every_fleet_option() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", result.output))
    for option in ("--agents", "--duration", "--write-ratio", "--search-ratio",
                   "--snapshot-ratio", "--iteration-ratio", "--artifact-ratio", "--fleets",
                   "--seed", "--start", "--no-start", "--home", "--db", "--postgres-url",
                   "--embedder", "--json", "--out"):
        assert option in text, option
    for phrase in ("closed loop", "stops by itself", "SnapshotForRun with verify",
                   "endpoints.json", "0 turns an operation off", "fresh database per service"):
        assert phrase in text, phrase
    # Each fleet option states its default in words the help renderer keeps.
    defaulted = ("--agents", "--duration", "--write-ratio", "--search-ratio",
                 "--snapshot-ratio", "--iteration-ratio", "--artifact-ratio", "--fleets",
                 "--seed", "--home", "--db", "--postgres-url", "--embedder")
    starts = sorted((text.index(f" {option} <"), option) for option in defaulted)
    for (start, option), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        assert "(default: " in text[start:end], option
    assert "127.0.0.1:5432/postgres" in text


def test_cli_refuses_fleet_options_for_other_benchmarks_and_scale_for_fleet() -> None:
    result = CliRunner().invoke(app, ["bench", "shard", "--agents", "3"])
    assert result.exit_code == 1
    assert "only for `engram bench fleet`" in result.output
    result = CliRunner().invoke(app, ["bench", "fleet", "--scale", "0.1"])
    assert result.exit_code == 1
    assert "not --scale" in result.output
    result = CliRunner().invoke(app, ["bench", "fleet", "--agents", "2", "--fleets", "5"])
    assert result.exit_code == 1
    assert "fleets must be" in result.output


def test_no_start_without_a_running_stack_says_what_to_do(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "endpoints.json").write_text(json.dumps(
        {name: f"127.0.0.1:{port}" for name in fleet.SERVICES}))
    result = CliRunner().invoke(app, ["bench", "fleet", "--no-start", "--home", str(tmp_path),
                                      "--agents", "1", "--duration", "1", "--json"])
    assert result.exit_code == 1
    assert "not SERVING" in result.output and "engram up" in result.output


def test_a_run_where_every_operation_failed_exits_non_zero_after_reporting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(fleet, "running_stack", lambda _home: _dead_stack())
    monkeypatch.setattr(fleet, "echo_baseline", lambda **_kw: {
        "echo_p50_ms": 0.5, "echo_p95_ms": 0.9, "echo_calls_per_s": 2000.0})
    out = tmp_path / "fleet.json"
    result = CliRunner().invoke(app, ["bench", "fleet", "--no-start", "--agents", "2",
                                      "--duration", "0.5", "--json", "--out", str(out)])
    assert result.exit_code == 1
    assert "no operation succeeded (UNAVAILABLE x" in result.output
    figures = json.loads(out.read_text())
    assert figures["ops"] == 0 and figures["errors"]["UNAVAILABLE"] >= 2


def test_the_summary_tables_show_every_operation_error_and_the_echo() -> None:
    tally = Tally()
    tally.ok("write", 0.002)
    tally.failed("search", "DEADLINE_EXCEEDED")
    figures = {"agents": 2, "fleets": 1, "stack": "started stack on sqlite",
               **summarize(tally, 1.0),
               "echo": {"p50_ms": 0.4, "p95_ms": 0.6, "calls_per_s": 2500.0, "in_flight": 2},
               "ops_per_s_vs_echo": 0.0004,
               "machine": {"nproc": 2, "load_average_before": [1.0, 1.0, 1.0],
                           "load_average_after": [2.0, 1.0, 1.0]},
               "cpu_s": {"shard": 0.5, "load generator": 0.2}}
    console = Console(width=200, record=True)
    for table in fleet.summary_tables(figures):
        console.print(table)
    text = console.export_text()
    for expected in ("write", "search", "DEADLINE_EXCEEDED", "2,500.0", "load generator",
                     "load average 1.0 -> 2.0"):
        assert expected in text, expected


def test_cpu_seconds_of_this_process_grow_with_work() -> None:
    import os

    before = fleet.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert fleet.cpu_seconds(os.getpid()) >= before + 0.1
