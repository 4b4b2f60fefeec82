"""A second shard replica over the same store drops erased records from its in-memory index
within its poll interval (the change feed is the tombstones table), without a restart: in a
fleet of two records (both replicas rebuild it) and of eight (both remove it in place): its
terms no longer rank anything, and semantic search (the replica reading the primary's stored
vectors) no longer returns it. That its vector leaves the replica's in-memory index is shown
by tests/unit/retrieval/test_index_forget.py: here a hit is also dropped when its record is
read and found erased."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engram.client import ShardClient
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.stack import full_stack

FLEET = "fleet-r"


@pytest.mark.parametrize("others", [0, 6], ids=["rebuilt", "in-place"])
def test_another_replica_forgets_within_its_poll(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch, others: int) -> None:
    admin = make_token("op", FLEET, ADMIN)
    agent = make_token("scout-1", FLEET)
    data = tmp_path / "data"
    embedder = {"embedder": "hash", "allow_test_embedder": True}
    with full_stack(data, engram_home, make_token, shard=embedder) as stack:
        with ShardClient(stack.shard.address, agent) as shard:
            secret = shard.add("the vault combination is 4-8-15", run_id="run-1").record
            shard.add("the next step of the same run", run_id="run-1")
            for n in range(others):  # one erased record of eight: removed in place
                shard.add(f"an unrelated note number {n}", run_id="run-2")
        replica, _ = build_shard_server(ShardSettings(
            home=engram_home, port=0, db_url=f"sqlite:///{data / 'shard.db'}",
            allow_ungated=True, index_snapshot_path=tmp_path / "replica.snapshot", **embedder))
        replica.start()
        try:
            with ShardClient(replica.address, admin) as other:
                # the run's next record shares the erased one's terms (run context)
                assert other.search("vault combination", mode="lexical")
                deadline = time.monotonic() + 30  # the primary embeds, the replica reads it

                def nearest() -> list[str]:
                    return [h.record.id for h in other.search("the vault combination is 4-8-15",
                                                              mode="semantic", limit=3)]

                while secret.id not in nearest():
                    assert time.monotonic() < deadline, "the replica never found its vector"
                    time.sleep(0.1)
                with cli_for(stack, admin, monkeypatch) as run:
                    assert run("forget", "--record", secret.id)["erased"] == 1
                deadline = time.monotonic() + 10
                while other.search("vault combination", mode="lexical"):
                    assert time.monotonic() < deadline, "the replica still ranks by erased terms"
                    time.sleep(0.1)
                assert other.search("next step", mode="lexical")
                assert secret.id not in nearest()  # its vector is gone too
                assert other.search("the next step of the same run", mode="semantic")
        finally:
            replica.stop(0)
