"""The defaults the README documents, read from an environment that sets none of them."""

from __future__ import annotations

import os

import pytest

from services.artifacts.settings import ArtifactsSettings
from services.common.settings import LimitsSettings
from services.compactor.settings import CompactorSettings
from services.governance.settings import GovernanceSettings
from services.shard.settings import ShardSettings

SETTINGS = (ShardSettings, GovernanceSettings, ArtifactsSettings, CompactorSettings)


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ENGRAM_")]:
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_environment")
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.__name__)
def test_the_admission_defaults_are_the_readmes(settings: type) -> None:
    read = settings()
    assert read.max_concurrent_rpcs == 128
    assert read.admission == "static"
    assert (read.rate_limit_reads, read.rate_limit_read_burst) == (200.0, 400)
    assert (read.rate_limit_writes, read.rate_limit_write_burst) == (100.0, 200)
    assert read.max_streams_per_agent == 32
    assert read.db_pool_timeout_seconds == 5.0


@pytest.mark.usefixtures("clean_environment")
def test_the_shards_own_defaults_are_the_readmes() -> None:
    shard = ShardSettings()
    assert shard.allow_ungated is False  # fail closed: a shard needs governance
    assert shard.dedup == "exact"
    assert (shard.rate_limit_records, shard.record_burst()) == (1000.0, 2000)


@pytest.mark.usefixtures("clean_environment")
def test_the_limits_defaults_are_the_readmes() -> None:
    limits = LimitsSettings()
    assert limits.tags_per_filter == 32
    assert limits.batch_items == 1000
    assert limits.grpc_receive_bytes == 4 * 1024 * 1024
