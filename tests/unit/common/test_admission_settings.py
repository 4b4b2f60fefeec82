"""The admission settings added on 2026-11-28 (streams per fleet, records per agent) refuse
values that make no sense, like the settings beside them, and default as docs/security.md
says."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.artifacts.settings import ArtifactsSettings
from services.shard.settings import ShardSettings


@pytest.mark.parametrize("field", ["max_streams_per_fleet", "max_streams"])
@pytest.mark.parametrize("value", ["0", "-1", "many", "1.5"])
def test_stream_caps_are_whole_numbers_of_at_least_one(
        field: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"ENGRAM_SHARD_{field.upper()}", value)
    with pytest.raises(ValidationError, match=field):
        ShardSettings()


def test_streams_per_fleet_defaults_to_half_the_concurrency_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert ShardSettings().streams_per_fleet() == 64
    assert ShardSettings(max_concurrent_rpcs=9).streams_per_fleet() == 4
    assert ShardSettings(max_concurrent_rpcs=1).streams_per_fleet() == 1
    monkeypatch.setenv("ENGRAM_ARTIFACTS_MAX_STREAMS_PER_FLEET", "7")
    assert ArtifactsSettings().streams_per_fleet() == 7


def test_streams_in_all_default_to_three_quarters_of_the_concurrency_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert ShardSettings().streams_total() == 96
    assert ShardSettings(max_concurrent_rpcs=9).streams_total() == 6
    assert ShardSettings(max_concurrent_rpcs=1).streams_total() == 1
    monkeypatch.setenv("ENGRAM_ARTIFACTS_MAX_STREAMS", "7")
    assert ArtifactsSettings().streams_total() == 7


@pytest.mark.parametrize(("name", "value"), [
    ("RATE_LIMIT_RECORDS", "-1"), ("RATE_LIMIT_RECORDS", "fast"),
    ("RATE_LIMIT_RECORDS", "inf"), ("RATE_LIMIT_RECORDS", "nan"),
    ("RATE_LIMIT_RECORD_BURST", "0"), ("RATE_LIMIT_RECORD_BURST", "-5"),
    ("RATE_LIMIT_RECORD_BURST", "lots"), ("RATE_LIMIT_RECORD_BURST", "999"),
])
def test_the_record_rate_refuses_what_makes_no_sense(
        name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"ENGRAM_SHARD_{name}", value)
    with pytest.raises(ValidationError, match=name.lower()):
        ShardSettings()


def test_the_record_burst_always_holds_a_full_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ShardSettings()
    assert (settings.rate_limit_records, settings.record_burst()) == (1000.0, 2000)
    assert ShardSettings(rate_limit_records=10).record_burst() == 1000  # the batch limit
    assert ShardSettings(rate_limit_records=0).rate_limit_records == 0  # off
    monkeypatch.setenv("ENGRAM_LIMITS_BATCH_ITEMS", "5000")
    assert ShardSettings().record_burst() == 5000
    with pytest.raises(ValidationError, match="ENGRAM_LIMITS_BATCH_ITEMS"):
        ShardSettings(rate_limit_record_burst=4999)
    monkeypatch.setenv("ENGRAM_SHARD_RATE_LIMIT_RECORD_BURST", "6000")
    assert ShardSettings().record_burst() == 6000
