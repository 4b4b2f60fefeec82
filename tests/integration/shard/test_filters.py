"""RecordFilter on SearchRecords and ListRecords: each kind, before ranking, combined, bad
input, and never across fleets (the same suite on SQLite and Postgres)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import grpc
import pytest

from engram.client import EngramRpcError, ShardClient, record_input
from engram.shard.v1 import shard_service_pb2 as pb
from tests.integration.shard.conftest import ClientFactory


def _rfc3339(record: pb.Record) -> str:
    return record.create_time.ToDatetime(tzinfo=UTC).isoformat()


def _ids(hits: list[pb.SearchHit]) -> set[str]:
    return {hit.record.id for hit in hits}


@pytest.fixture
def corpus(client_for: ClientFactory) -> dict[str, pb.Record]:
    """Five notes about the release checklist, differing in every filterable field."""
    alice, bob = client_for("alice"), client_for("bob")
    out: dict[str, pb.Record] = {}
    out["a"] = alice.add("release checklist: tag the build", tags=["ops", "release"],
                         metadata={"project": "apollo", "env": "prod"}, importance=0.9,
                         domain="technical").record
    time.sleep(0.01)
    out["b"] = alice.add("release checklist: update the changelog", tags=["docs"],
                         metadata={"project": "apollo", "env": "dev"}, importance=0.2,
                         domain="projects").record
    time.sleep(0.01)
    out["c"] = bob.add("release checklist: notify the on-call", tags=["ops"],
                       metadata={"project": "gemini", "env": "prod"}, importance=0.6,
                       domain="technical").record
    time.sleep(0.01)
    out["d"] = bob.add("release checklist: freeze merges", tags=["release"],
                       metadata={"project": "gemini"}, importance=0.4,
                       domain="projects").record
    time.sleep(0.01)
    out["e"] = bob.add("release checklist: archive the logs", importance=0.5,
                       domain="technical").record
    return out


CASES = {
    "metadata": ({"metadata": {"project": "apollo"}}, "ab"),
    "metadata pairs all match": ({"metadata": {"project": "apollo", "env": "prod"}}, "a"),
    "tags any": ({"tags_any": ["docs", "release"]}, "abd"),
    "tags all": ({"tags": ["ops", "release"]}, "a"),
    "min importance": ({"min_importance": 0.5}, "ace"),
    "combined": ({"tags_any": ["ops"], "metadata": {"env": "prod"}, "min_importance": 0.7},
                 "a"),
}


@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_filter_kind_on_search_and_list(client: ShardClient, corpus: dict[str, pb.Record],
                                             case: str, mode: str) -> None:
    kwargs, expected = CASES[case]
    want = {corpus[k].id for k in expected}
    assert _ids(client.search("release checklist", limit=10, mode=mode, **kwargs)) == want
    assert {r.id for r in client.list(**kwargs)} == want


def test_author_and_created_window(client: ShardClient, corpus: dict[str, pb.Record]) -> None:
    bobs = {corpus[k].id for k in "cde"}
    assert _ids(client.search("release checklist", author="bob")) == bobs
    assert {r.id for r in client.list(agent_id="bob")} == bobs
    after, before = _rfc3339(corpus["b"]), _rfc3339(corpus["e"])
    between = {corpus["c"].id, corpus["d"].id}  # both bounds are exclusive
    assert _ids(client.search("release checklist", created_after=after,
                              created_before=before)) == between
    assert {r.id for r in client.list(created_after=after, created_before=before)} == between
    assert {r.id for r in client.list(created_after=datetime.now(UTC))} == set()


@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_a_filtered_search_is_the_top_k_among_matching_records(client: ShardClient,
                                                                 mode: str) -> None:
    strong = [client.add(f"deploy checklist deploy checklist step {i}",
                         importance=0.9).record.id for i in range(25)]
    weak = [client.add(f"a long note on lunch, the weather, travel plans and at the end "
                       f"one mention of the deploy checklist {i}", tags=["rare"],
                       metadata={"kind": "rare"}, importance=0.1).record.id for i in range(3)]
    unfiltered = _ids(client.search("deploy checklist", limit=3, mode=mode))
    assert unfiltered <= set(strong)
    assert _ids(client.search("deploy checklist", limit=3, mode=mode,
                              tags_any=["rare"])) == set(weak)
    assert _ids(client.search("deploy checklist", limit=2, mode=mode,
                              metadata={"kind": "rare"})) < set(weak)


def test_list_pages_through_a_filter_and_the_token_binds_it(client: ShardClient) -> None:
    tagged = [client.add(f"item {i}", tags=["keep"] if i % 3 == 0 else [],
                         metadata={"n": str(i % 2)}).record.id for i in range(20)]
    want = [rid for i, rid in enumerate(tagged) if i % 3 == 0 and i % 2 == 0][::-1]
    assert [r.id for r in client.list(tags_any=["keep"], metadata={"n": "0"},
                                      page_size=2)] == want
    flt = pb.RecordFilter(tags_any=["keep"])
    first = client.stub.ListRecords(pb.ListRecordsRequest(page_size=2, filter=flt),
                                    metadata=client.metadata)
    assert first.next_page_token
    other = pb.RecordFilter(tags_any=["keep"], min_importance=0.1)
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.ListRecords(pb.ListRecordsRequest(page_size=2, filter=other,
                                                      page_token=first.next_page_token),
                                metadata=client.metadata)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _request_with(**fields: object) -> pb.RecordFilter:
    return pb.RecordFilter(**fields)  # type: ignore[arg-type]


BAD = {
    "importance above 1": (_request_with(min_importance=1.5), "INVALID_IMPORTANCE"),
    "importance below 0": (_request_with(min_importance=-0.1), "INVALID_IMPORTANCE"),
    "importance NaN": (_request_with(min_importance=float("nan")), "INVALID_IMPORTANCE"),
    "too many pairs": (_request_with(metadata={f"k{i}": "v" for i in range(17)}),
                       "FILTER_TOO_LARGE"),
    "too many tags": (_request_with(tags_any=[f"t{i}" for i in range(33)]), "LIMIT_EXCEEDED"),
    "quote in key": (_request_with(metadata={'a"b': "v"}), "INVALID_METADATA_KEY"),
    "empty window": (pb.RecordFilter(created_after={"seconds": 20}, created_before={"seconds": 10}),
                     "INVALID_TIME_RANGE"),
    "year 10000": (pb.RecordFilter(created_after={"seconds": 253_402_300_800}),
                   "INVALID_TIMESTAMP"),
    "conflicting run": (_request_with(run_id="other"), "CONFLICTING_FILTER"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_filters_are_invalid_argument_with_a_reason(client: ShardClient, case: str) -> None:
    flt, reason = BAD[case]
    client.add("something to find")
    requests = [
        (client.stub.SearchRecords,
         pb.SearchRecordsRequest(query="something", filter=flt, run_id="r")),
        (client.stub.ListRecords, pb.ListRecordsRequest(filter=flt, run_id="r")),
    ]
    for method, request in requests:
        with pytest.raises(grpc.RpcError) as caught:
            method(request, metadata=client.metadata)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
        with pytest.raises(EngramRpcError) as wrapped:
            client.call(method, request)
        assert wrapped.value.reason == reason


def test_the_sdk_refuses_malformed_times_and_importance_before_sending(
        client: ShardClient) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        client.search("x", created_after="2026-05-01")
    with pytest.raises(ValueError, match="RFC 3339"):
        list(client.list(created_before="yesterday"))
    with pytest.raises(ValueError, match=r"0\.\.1"):
        client.search("x", min_importance=2.0)


def test_a_filter_never_reaches_another_fleets_records(client_for: ClientFactory) -> None:
    mine = client_for("alice", "fleet-a")
    theirs = client_for("alice", "fleet-b")
    theirs.add_many([record_input("secret launch codes", tags=["ops"],
                                  metadata={"project": "apollo"}, importance=1.0)])
    own = mine.add("launch codes are rotated", tags=["ops"], metadata={"project": "apollo"})
    kinds: list[dict[str, object]] = [{"tags_any": ["ops"]}, {"metadata": {"project": "apollo"}},
                                      {"author": "alice"}, {"min_importance": 0.0}]
    for kwargs in kinds:
        assert _ids(mine.search("launch codes", **kwargs)) == {own.record.id}  # type: ignore[arg-type]
        listed = {("agent_id" if k == "author" else k): v for k, v in kwargs.items()}
        assert {r.id for r in mine.list(**listed)} == {own.record.id}
