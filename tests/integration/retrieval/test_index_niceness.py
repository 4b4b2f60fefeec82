"""README, Search: "background indexing runs `ENGRAM_SHARD_INDEX_NICENESS` (10) lower than
requests". A started shard's indexer thread is seen at the process's nice value plus 10."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from engram.client import ShardClient
from services.shard.server import build_shard_server
from services.shard.service import ShardService
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


def _indexer_nice(service: ShardService, deadline: float) -> int:
    index = service.search_engine.index
    assert index is not None and index._thread is not None
    assert index._thread.name == "search-indexer"
    native = index._thread.native_id
    assert native is not None
    while True:
        nice = os.getpriority(os.PRIO_PROCESS, native)
        if nice != os.getpriority(os.PRIO_PROCESS, os.getpid()) or time.monotonic() > deadline:
            return nice
        time.sleep(0.01)  # the thread lowers itself as it starts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")
def test_the_background_indexer_runs_10_lower_than_requests(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("ENGRAM_SHARD_")]:
        monkeypatch.delenv(name)
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    if base > 9:
        pytest.skip(f"the test runs at nice {base}: 10 lower is capped at 19")
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True, embedder="hash",
                             allow_test_embedder=True)  # the index_niceness default
    server, service = build_shard_server(settings)
    server.start()
    try:
        with ShardClient(server.address, make_token("nice", "fleet-nice")) as client:
            client.add("A record for the indexer to embed.")
        assert _indexer_nice(service, time.monotonic() + 5) == base + 10
        # the request threads (this one included) keep the process's priority
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    finally:
        server.stop(0)
