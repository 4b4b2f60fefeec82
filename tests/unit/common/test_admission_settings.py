"""The admission settings added on 2026-11-28 (streams per fleet, records per agent) refuse
values that make no sense, like the settings beside them, and default as docs/security.md
says."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.artifacts.settings import ArtifactsSettings
from services.shard.settings import ShardSettings


@pytest.mark.parametrize("value", ["0", "-1", "many", "1.5"])
def test_streams_per_fleet_is_a_whole_number_of_at_least_one(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_SHARD_MAX_STREAMS_PER_FLEET", value)
    with pytest.raises(ValidationError, match="max_streams_per_fleet"):
        ShardSettings()


def test_streams_per_fleet_defaults_to_half_the_concurrency_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert ShardSettings().streams_per_fleet() == 64
    assert ShardSettings(max_concurrent_rpcs=9).streams_per_fleet() == 4
    assert ShardSettings(max_concurrent_rpcs=1).streams_per_fleet() == 1
    monkeypatch.setenv("ENGRAM_ARTIFACTS_MAX_STREAMS_PER_FLEET", "7")
    assert ArtifactsSettings().streams_per_fleet() == 7
