"""One fleet's heavy search does not stall another fleet (finding 7: a global index lock)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from engram.client import record_input
from engram.shard.v1 import shard_service_pb2 as pb
from services.shard.search.fleet_index import FleetIndex
from tests.integration.shard.conftest import ClientFactory

SLOW = "zzslowquery"


def test_a_long_search_in_one_fleet_delays_no_write_or_search_in_another(
        client_for: ClientFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet_a = client_for("agent-a", "fleet-a")
    fleet_b = client_for("agent-b", "fleet-b")
    fleet_a.add("fleet a remembers the deployment checklist")
    fleet_b.add("fleet b remembers the rollback plan")

    scoring, release = threading.Event(), threading.Event()
    score = FleetIndex.search

    def heavy(index: FleetIndex, text: str, *args: Any, **kwargs: Any) -> Any:
        if SLOW in text:  # stands for a huge query or index: scoring that takes its time
            scoring.set()
            release.wait(30)
        return score(index, text, *args, **kwargs)

    monkeypatch.setattr(FleetIndex, "search", heavy)
    slow_hits: list[object] = []
    searcher = threading.Thread(
        target=lambda: slow_hits.extend(fleet_a.search(f"{SLOW} deployment checklist")))
    searcher.start()
    try:
        assert scoring.wait(10), "fleet a's search never reached scoring"
        written = fleet_b.call(fleet_b.stub.CreateRecord, _create("fleet b: a new memory"),
                               timeout=5)
        hits = fleet_b.call(fleet_b.stub.SearchRecords, _search("rollback plan"), timeout=5)
        assert searcher.is_alive(), "fleet b's calls must finish while fleet a's still scores"
    finally:
        release.set()
        searcher.join(30)
    assert written.created
    assert [h.record.content for h in hits.hits][:1] == ["fleet b remembers the rollback plan"]
    assert slow_hits, "fleet a's search completes once scoring ends"


def _create(content: str) -> pb.CreateRecordRequest:
    return pb.CreateRecordRequest(record=record_input(content))


def _search(query: str) -> pb.SearchRecordsRequest:
    return pb.SearchRecordsRequest(query=query, limit=5, mode=pb.SEARCH_MODE_LEXICAL)
