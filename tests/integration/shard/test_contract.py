"""Listing, pagination, domains, cross-references, request ids and bad input."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from engram.client import EngramRpcError, ShardClient, record_input
from engram.shard.v1 import shard_service_pb2 as pb
from services.shard.domain import records
from services.shard.search.engine import CROSS_FAN_IN
from services.shard.service import ShardService
from tests.integration.shard.conftest import ClientFactory
from tests.scans import Held, third_scan_is_busy


def _invalid(call, reason: str) -> EngramRpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(EngramRpcError) as caught:
        call()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert caught.value.reason == reason
    return caught.value


def test_list_filters_and_paginates(client: ShardClient) -> None:
    written = [
        client.add(
            f"task: item {i}",
            tags=["even"] if i % 2 == 0 else ["odd"],
            run_id="run-1" if i < 5 else "",
        ).record.id
        for i in range(12)
    ]
    assert [r.id for r in client.list(page_size=5)] == list(reversed(written))
    assert {r.id for r in client.list(tags=["even"])} == set(written[0::2])
    assert {r.id for r in client.list(run_id="run-1")} == set(written[:5])
    assert {r.id for r in client.list(run_id="")} == set(written[5:])
    first = client.stub.ListRecords(pb.ListRecordsRequest(page_size=5), metadata=client.metadata)
    assert len(first.records) == 5 and first.next_page_token
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.ListRecords(
            pb.ListRecordsRequest(page_size=5, domain="insights", page_token=first.next_page_token),
            metadata=client.metadata,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.ListRecords(
            pb.ListRecordsRequest(page_token="garbage!"), metadata=client.metadata
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_input_stores_nothing(client: ShardClient) -> None:
    _invalid(lambda: client.add(""), "EMPTY_CONTENT")
    _invalid(lambda: client.add("x" * 40_000), "CONTENT_TOO_LARGE")
    _invalid(lambda: client.add("x", importance=1.5), "IMPORTANCE_OUT_OF_RANGE")
    _invalid(lambda: client.add("x", domain="astrology"), "UNKNOWN_DOMAIN")
    error = _invalid(
        lambda: client.add("see shard nowhere for details"), "CROSS_REFERENCE_TARGET_NOT_FOUND"
    )
    assert "nowhere" in error.message
    _invalid(lambda: client.add("shard:" + "ab" * 16), "CROSS_REFERENCE_TARGET_NOT_FOUND")
    _invalid(
        lambda: client.add(" ".join(f"see shard technical{i}" for i in range(9))),
        "TOO_MANY_CROSS_REFERENCES",
    )
    _invalid(lambda: client.search(""), "EMPTY_QUERY")
    assert list(client.list()) == []
    assert client.status().total_records == 0


def test_cross_references_are_bidirectional(client: ShardClient) -> None:
    target = client.add("architecture: the gateway protocol uses mTLS").record
    source = client.add(f"incident review, see shard technical and shard:{target.id}").record
    assert list(source.cross_refs) == ["domain:technical", f"record:{target.id}"]
    direct = client.search("incident review")
    assert [h.record.id for h in direct] == [source.id]
    crossed = client.search("incident review", cross=True)
    by_id = {h.record.id: h.via for h in crossed}
    assert by_id[source.id] == "direct" and by_id[target.id] == "cross_ref"
    # reverse direction: a hit on the target leads back to the record that links to it
    back = {h.record.id: h.via for h in client.search("gateway mTLS", cross=True)}
    assert back[target.id] == "direct" and back[source.id] == "cross_ref"
    technical = next(d for d in client.status().domains if d.name == "technical")
    assert technical.incoming_links == 1


def test_a_cross_search_reads_a_bounded_number_of_records_citing_a_hit(
        client_for: ClientFactory, shard: tuple[str, ShardService]) -> None:
    """Found by review: any number of records may cite one record, and a search with cross
    read every one of them (34,000: 1.8 s against 2 ms) for each reader whose hits included
    it. Now at most CROSS_FAN_IN per result asked for."""
    agent = client_for("agent-1", "fleet-a")
    target = agent.add("architecture: the gateway protocol uses mTLS").record
    agent.add_many([record_input(f"citation {i}: see shard:{target.id}") for i in range(150)])
    repo = shard[1].search_engine.repo
    asked: list[int] = []
    by_ids = repo.by_ids

    def counted(session, fleet_id, ids, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(len(ids))
        return by_ids(session, fleet_id, ids, **kwargs)

    repo.by_ids = counted  # type: ignore[method-assign]
    try:
        hits = agent.search("gateway mTLS", cross=True, limit=2)
    finally:
        repo.by_ids = by_ids  # type: ignore[method-assign]
    assert hits[0].record.id == target.id
    assert [h.via for h in hits[1:]] == ["cross_ref", "cross_ref"]
    assert max(asked) <= CROSS_FAN_IN * 2  # not 150


def _verify_all_at_once(client: ShardClient) -> pb.VerifyRecordsResponse:
    """VerifyRecords(all) in one call, unpaged (ShardClient.verify pages)."""
    return client.call(client.stub.VerifyRecords, pb.VerifyRecordsRequest(all=True))


def test_whole_fleet_verifications_take_a_scan_slot(
        client_for: ClientFactory, shard: tuple[str, ShardService],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: VerifyRecords with all re-hashes every record of the fleet (about
    50 µs each: a minute at 1M records) for one read of any agent's budget, as many at once as
    it liked. Now at most two run on a replica; a third is RESOURCE_EXHAUSTED SCAN_BUSY (and
    only governors and admins may ask for one: test_an_agent_verifies_the_fleet_page_by_page)."""
    agent = client_for("agent-1", "fleet-a")
    governor = client_for("gov-1", "fleet-a", ("governor",))
    stored = agent.add("one record to verify").record
    held = Held()
    monkeypatch.setattr(records, "verify", held.wrap(records.verify))
    answers = third_scan_is_busy(held, lambda: _verify_all_at_once(governor).checked,
                                 lambda: _verify_all_at_once(governor))
    assert answers == [1, 1]
    assert _verify_all_at_once(governor).checked == 1 and agent.verify([stored.id]).checked == 1
    assert agent.verify(all_records=True).checked == 1  # paged: no scan slot


def test_an_agent_verifies_the_fleet_page_by_page(
        client_for: ClientFactory, shard: tuple[str, ShardService]) -> None:
    """A whole-fleet verification in one call is the governor's and admin's (any agent could
    otherwise make a replica re-hash a fleet of millions per read of its budget); an agent
    pages it, each call bounded by page_size, records first, then tombstones. Paging covers
    every record and tombstone once; bad paging input is refused."""
    agent = client_for("agent-1", "fleet-a")
    admin = client_for("op", "fleet-a", ("admin",))
    for n in range(7):
        agent.add(f"record {n} to page through")
    client_for("agent-9", "fleet-b").add("another fleet's record")
    with pytest.raises(EngramRpcError) as refused:
        _verify_all_at_once(agent)
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.PERMISSION_DENIED,
                                                           "ROLE_REQUIRED")
    assert "page_size" in refused.value.message
    with pytest.raises(EngramRpcError) as sneaked:  # ids beside all: still the whole fleet
        agent.call(agent.stub.VerifyRecords, pb.VerifyRecordsRequest(all=True, ids=["x"]))
    assert sneaked.value.reason == "ROLE_REQUIRED"
    for size in (1, 3, 7, 100):
        pages = list(agent.verify_pages(size))
        assert all(page.checked + page.tombstoned <= size for page in pages)
        assert sum(page.checked for page in pages) == 7
        assert not any(page.failures for page in pages)
    assert _verify_all_at_once(admin).checked == 7
    assert agent.verify(all_records=True).checked == 7
    for bad, reason in ((pb.VerifyRecordsRequest(ids=["x"], page_size=5), "PAGING_WITH_IDS"),
                        (pb.VerifyRecordsRequest(page_size=5), "PAGING_WITH_IDS"),
                        (pb.VerifyRecordsRequest(all=True, page_token="forged.token"), None),
                        (pb.VerifyRecordsRequest(all=True, page_size=-1), None)):
        with pytest.raises(EngramRpcError) as error:
            agent.call(agent.stub.VerifyRecords, bad)
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert reason is None or error.value.reason == reason
    first = agent.call(agent.stub.VerifyRecords,
                       pb.VerifyRecordsRequest(all=True, page_size=2))
    with pytest.raises(EngramRpcError) as stolen:  # a token is bound to its caller
        client_for("agent-2", "fleet-a").call(agent.stub.VerifyRecords, pb.VerifyRecordsRequest(
            all=True, page_size=2, page_token=first.next_page_token))
    assert stolen.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_links_stay_in_the_fleet(client_for: ClientFactory) -> None:
    other = client_for("bob", "fleet-b").add("architecture note in fleet b").record
    mine = client_for("alice", "fleet-a")
    _invalid(lambda: mine.add(f"see shard:{other.id}"), "CROSS_REFERENCE_TARGET_NOT_FOUND")


def test_request_id_replays_and_refuses_reuse(client: ShardClient) -> None:
    first = client.add_many(
        [record_input("task: one"), record_input("task: two")], request_id="req-1"
    )
    again = client.add_many(
        [record_input("task: one"), record_input("task: two")], request_id="req-1"
    )
    assert [r.record.id for r in first.results] == [r.record.id for r in again.results]
    assert all(r.created for r in first.results) and not any(r.created for r in again.results)
    _invalid(
        lambda: client.add_many([record_input("task: three")], request_id="req-1"),
        "REQUEST_ID_REUSED",
    )


def test_domains_route_and_upsert(client_for: ClientFactory) -> None:
    agent = client_for("agent-1", "fleet-a")
    admin = client_for("admin", "fleet-a", ("admin",))
    assert {d.name for d in agent.domains()} == {
        "projects",
        "insights",
        "people",
        "technical",
        "strategy",
    }
    with pytest.raises(EngramRpcError) as caught:
        agent.upsert_domain("finance", keywords=["budget"])
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
    reply = admin.upsert_domain("finance", keywords=["budget", "invoice"])
    assert reply.created
    assert agent.add("budget invoice for Q3 budget").record.domain == "finance"
    assert agent.search("budget", domain="finance")[0].record.domain == "finance"
    assert not admin.upsert_domain("finance", keywords=["budget", "cost"]).created
    # past the display name's column: Postgres failed INTERNAL, SQLite kept it (review)
    _invalid(lambda: admin.upsert_domain("finance", display_name="x" * 129), "LIMIT_EXCEEDED")
    _invalid(lambda: admin.upsert_domain("legal", description="x" * 4097), "LIMIT_EXCEEDED")
    assert {d.name: d.display_name for d in agent.domains()}["finance"] == "Finance"
    assert "legal" not in {d.name for d in agent.domains()}
    summary = json.loads(agent.summary())
    assert summary["total_shards"] == 6 and summary["total_transactions"] == 1
    finance = next(s for s in summary["shards_status"] if s["domain"] == "finance")
    assert finance["shard_id"] == "shard_finance" and finance["transactions"] == 1


def test_search_ranks_by_relevance_and_importance(client: ShardClient) -> None:
    low = client.add("deployment rollback procedure notes", importance=0.1).record
    high = client.add("deployment rollback procedure checklist", importance=0.9).record
    client.add("unrelated: lunch menu")
    hits = client.search("deployment rollback procedure")
    assert [h.record.id for h in hits] == [high.id, low.id]
    assert hits[0].score > hits[1].score > 0
    assert client.search("rollback", run_id="nope") == []
    with pytest.raises(EngramRpcError) as caught:
        client.search("x", limit=1000)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_roles_are_enforced(client_for: ClientFactory) -> None:
    governor = client_for("gov", "fleet-a", ("governor",))
    with pytest.raises(EngramRpcError) as caught:
        governor.add("task: governors do not write memories")
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert governor.status().total_records == 0
    agent = client_for()
    with pytest.raises(EngramRpcError) as caught:
        agent.compact("fleet-a")
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_a_domain_created_by_a_concurrent_call_is_updated_not_internal(
        shard: tuple[str, ShardService], client_for: ClientFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """UpsertDomain reads the fleet's domains, then inserts a new one: a concurrent call that
    created it in between made the insert hit its key, answered INTERNAL."""
    _, service = shard
    admin = client_for("admin", "fleet-a", ("admin",))
    admin.upsert_domain("finance", keywords=["budget"])  # the concurrent call, committed
    domains = service.domains
    calls: list[bool] = []

    def before_it_was_created(fleet: str, *, fresh: bool = False) -> list[Any]:
        calls.append(fresh)
        found = domains(fleet, fresh=fresh)
        return [d for d in found if d.name != "finance"] if len(calls) == 1 else found

    monkeypatch.setattr(service, "domains", before_it_was_created)
    reply = admin.upsert_domain("finance", keywords=["budget", "invoice"])
    assert not reply.created and list(reply.domain.keywords) == ["budget", "invoice"]
    assert len(calls) == 2
