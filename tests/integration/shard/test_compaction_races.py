"""Two compactions of the same fleet at once (an operator's run beside the compactor's
schedule), on SQLite and Postgres: both answer, and each original is summarised once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engram.client import EngramRpcError, ShardClient
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN
from tests.stack import full_stack

FLEET = "fleet-k"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_compactions_at_once_summarise_each_original_once(
        backend: str, tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        request: pytest.FixtureRequest) -> None:
    urls = {}
    if backend == "postgres":
        make = request.getfixturevalue("fresh_postgres_urls")
        urls = {name: make() for name in ("shard", "governance", "artifacts", "compactor")}
    admin = make_token("op", FLEET, ADMIN)
    with full_stack(tmp_path / "data", engram_home, make_token, urls, governed=True) as stack:
        with ShardClient(stack.shard.address, make_token("scout-1", FLEET)) as shard:
            for run in range(4):
                for i in range(3):
                    shard.add(f"low note {i} of run {run}", run_id=f"run-{run}",
                              importance=0.1, domain="projects")
        outcomes: list[object] = []
        start = threading.Barrier(2)

        def compact() -> None:
            with ShardClient(stack.shard.address, admin) as shard:
                start.wait()
                try:
                    outcomes.append(shard.compact(importance_below=0.35, older_than_days=0))
                except EngramRpcError as error:
                    outcomes.append(f"{error.code.name} {error.reason}")

        both = [threading.Thread(target=compact) for _ in range(2)]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join(timeout=60)
        assert not [o for o in outcomes if isinstance(o, str)], outcomes
        with ShardClient(stack.shard.address, admin) as shard:
            summaries = [r for r in shard.list(page_size=100) if r.source == "compactor"]
            replaced = [i for o in outcomes for g in o.groups for i in g.replaced_ids]  # type: ignore[attr-defined]
        assert len(summaries) == 4, [s.content[:40] for s in summaries]
        assert len(set(replaced)) == 12
