"""The limits added on 2026-11-25 refuse values that would turn them off or make no sense."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.governance.settings import GovernanceSettings
from services.shard.settings import ShardSettings


@pytest.mark.parametrize("value", [0, -1])
def test_streams_per_agent_and_erasure_bytes_per_day_are_at_least_one(value: int) -> None:
    with pytest.raises(ValidationError, match="max_streams_per_agent"):
        ShardSettings(max_streams_per_agent=value)
    with pytest.raises(ValidationError, match="erasure_bytes_per_day"):
        GovernanceSettings(erasure_bytes_per_day=value)


def test_the_limits_default_to_what_docs_security_says(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ShardSettings().max_streams_per_agent == 32
    assert GovernanceSettings().erasure_bytes_per_day == 64 * 1024 * 1024
    monkeypatch.setenv("ENGRAM_SHARD_MAX_STREAMS_PER_AGENT", "4")
    monkeypatch.setenv("ENGRAM_GOVERNANCE_ERASURE_BYTES_PER_DAY", "1000")
    assert ShardSettings().max_streams_per_agent == 4
    assert GovernanceSettings().erasure_bytes_per_day == 1000
