"""Every input of the shard has a limit; over it is a prompt refusal that names the setting.

Replays issue 15's findings against a real shard on SQLite and Postgres: an 8 MB query
(took 14 s and held up another fleet's write), 1,000 tags in a filter (INTERNAL), NUL
bytes (INTERNAL on Postgres), forged page tokens (INTERNAL), ids such as ``..``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError, ShardClient, record_input
from engram.client._channel import open_channel
from engram.shard.v1 import shard_service_pb2 as pb
from engram.shard.v1 import shard_service_pb2_grpc as pb_grpc
from services.common.settings import LimitsSettings
from services.shard.server import build_shard_server
from services.shard.service import ShardService
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory
from tests.integration.shard.conftest import ClientFactory

MB = 1024 * 1024


def _refused(call: Callable[[], object], reason: str = "LIMIT_EXCEEDED",
             setting: str = "") -> EngramRpcError:
    with pytest.raises(EngramRpcError) as caught:
        call()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert caught.value.reason == reason, caught.value
    if setting:
        assert setting in caught.value.message
        assert caught.value.metadata["setting"] == setting
    return caught.value


def test_an_8_mb_query_is_refused_at_once_and_another_fleets_write_goes_through(
        shard: tuple[str, ShardService], client_for: ClientFactory) -> None:
    address = shard[0]
    client_for().add("Deploys happen on Tuesdays")
    searcher = client_for("agent-1", "fleet-a")
    big = open_channel(address, max_send_bytes=16 * MB)  # a client that does send 8 MB
    outcome: dict[str, object] = {}

    def search() -> None:
        try:
            pb_grpc.ShardServiceStub(big).SearchRecords(
                pb.SearchRecordsRequest(query="deploy " * (8 * MB // 7)),
                metadata=searcher.metadata, timeout=60)
        except grpc.RpcError as error:
            outcome["search"] = error.code()

    thread = threading.Thread(target=search)
    thread.start()
    writer = client_for("agent-9", "fleet-b")
    writer.timeout = 10.0
    written = writer.add("Fleet B keeps writing while fleet A sends a huge query")
    thread.join(60)
    big.close()
    assert written.created
    assert outcome["search"] == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The SDK's channel refuses to send it at all.
    with pytest.raises(EngramRpcError) as caught:
        searcher.search("deploy " * (8 * MB // 7))
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_query_over_the_query_limit_is_refused_naming_the_setting(
        client: ShardClient) -> None:
    client.add("Deploys happen on Tuesdays")
    error = _refused(lambda: client.search("deploy " * 20_000),
                     setting="ENGRAM_LIMITS_QUERY_BYTES")
    assert "the query is 140000 bytes" in error.message
    assert client.search("deploy " * 1000, mode="lexical")


def test_a_filter_with_1000_tags_is_refused_not_internal(client: ShardClient) -> None:
    client.add("tagged", tags=["t1"])
    tags = [f"t{i}" for i in range(1000)]
    _refused(lambda: list(client.list(tags=tags)), setting="ENGRAM_LIMITS_TAGS_PER_FILTER")
    _refused(lambda: client.search("tagged", tags=tags), setting="ENGRAM_LIMITS_TAGS_PER_FILTER")
    _refused(lambda: list(client.list(tags=["x" * 65])), setting="ENGRAM_LIMITS_TAG_CHARS")
    assert len(list(client.list(tags=[f"t{i}" for i in range(1, 33)]))) == 0
    assert len(list(client.list(tags=["t1"]))) == 1
    # README: at most 32 tags "any and all together"
    all_of, any_of = [f"a{i}" for i in range(17)], [f"y{i}" for i in range(16)]
    _refused(lambda: list(client.list(tags=all_of, tags_any=any_of)),
             setting="ENGRAM_LIMITS_TAGS_PER_FILTER")
    _refused(lambda: client.search("tagged", tags=all_of, tags_any=any_of),
             setting="ENGRAM_LIMITS_TAGS_PER_FILTER")
    assert list(client.list(tags=all_of[:16], tags_any=any_of)) == []


def test_a_nul_byte_in_any_text_field_is_refused_and_stores_nothing(
        client: ShardClient) -> None:
    for fields in ({"content": "db password\x00hunter2"}, {"tags": ["ok", "bad\x00tag"]},
                   {"metadata": {"k": "v\x00"}}, {"metadata": {"k\x00": "v"}},
                   {"source": "cli\x00"}, {"run_id": "run\x00-1"}, {"domain": "insights\x00"}):
        message = record_input(**{"content": "a memory", **fields})  # type: ignore[arg-type]
        error = _refused(lambda message=message: client.call(
            client.stub.CreateRecord, pb.CreateRecordRequest(record=message)),
            reason="NUL_CHARACTER")
        assert error.metadata["field"].startswith("record."), error.metadata
    _refused(lambda: client.search("pass\x00word"), reason="NUL_CHARACTER")
    _refused(lambda: list(client.list(tags=["a\x00"])), reason="NUL_CHARACTER")
    assert list(client.list()) == []


def test_record_ids_and_run_ids_are_identifiers(client: ShardClient) -> None:
    for run_id in ("..", ".", "run\x01", "a b", "r" * 129):
        _refused(lambda run_id=run_id: client.add("x", run_id=run_id), reason="INVALID_RUN_ID")
        _refused(lambda run_id=run_id: list(client.list(run_id=run_id)), reason="INVALID_RUN_ID")
        with pytest.raises(EngramRpcError) as caught:
            list(client.snapshot(run_id))
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    for record_id in ("..", "id\x7f", "../etc"):
        with pytest.raises(EngramRpcError) as caught:
            client.get(record_id)
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    _refused(lambda: list(client.list(agent_id="..")), reason="INVALID_IDENTIFIER")
    for request_id in ("..", "a b", "k\x1b", "r" * 129):
        _refused(lambda request_id=request_id: client.add("x", request_id=request_id),
                 reason="INVALID_REQUEST_ID")
    assert list(client.list()) == []


def test_content_metadata_and_tags_name_their_settings(client: ShardClient) -> None:
    _refused(lambda: client.add("x" * (32 * 1024 + 1)), reason="CONTENT_TOO_LARGE",
             setting="ENGRAM_LIMITS_CONTENT_BYTES")
    _refused(lambda: client.add("x", metadata={"k": "v" * 9000}), reason="METADATA_TOO_LARGE",
             setting="ENGRAM_LIMITS_METADATA_BYTES")
    _refused(lambda: client.add("x", metadata={f"k{i}": "v" for i in range(33)}),
             reason="METADATA_TOO_LARGE", setting="ENGRAM_LIMITS_METADATA_ENTRIES")
    _refused(lambda: client.add("x", tags=[f"t{i}" for i in range(33)]), reason="INVALID_TAGS",
             setting="ENGRAM_LIMITS_TAGS_PER_RECORD")
    _refused(lambda: client.add_many([record_input(f"m{i}") for i in range(1001)]),
             reason="BATCH_TOO_LARGE", setting="ENGRAM_LIMITS_BATCH_ITEMS")
    assert list(client.list()) == []


def _old_style_token(key: list[object], filters: dict[str, object]) -> str:
    """The token format before signing: anyone could compute the filter digest."""
    raw = json.dumps(filters, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    body = json.dumps({"k": key, "f": digest}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def test_forged_altered_and_other_callers_page_tokens_are_refused(
        client_for: ClientFactory) -> None:
    alice, bob = client_for("alice", "fleet-a"), client_for("bob", "fleet-a")
    for i in range(6):
        alice.add(f"memory {i}")
    filters = {"run": None, "domain": "", "agent": "", "tags": [], "fleet": "fleet-a"}

    def page(client: ShardClient, token: str) -> pb.ListRecordsResponse:
        return client.call(client.stub.ListRecords,
                           pb.ListRecordsRequest(page_size=2, page_token=token))

    for forged in (_old_style_token(["not-a-number"], filters),
                   _old_style_token([10**30], filters), "garbage!", "a.b", "x" * 5000):
        _refused(lambda forged=forged: page(alice, forged), reason="INVALID_PAGE_TOKEN")
    token = page(alice, "").next_page_token
    assert len(page(alice, token).records) == 2
    body, signature = token.split(".")
    _refused(lambda: page(alice, f"{body}.{signature[::-1]}"), reason="INVALID_PAGE_TOKEN")
    error = _refused(lambda: page(bob, token), reason="INVALID_PAGE_TOKEN")
    assert "another caller" in error.message


def test_limits_are_settings(engram_home: Path, tmp_path: Path,
                             make_token: TokenFactory) -> None:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'small.db'}",
                             port=0, allow_ungated=True,
                             limits=LimitsSettings(query_bytes=16, content_bytes=10,
                                                   grpc_receive_bytes=64 * 1024))
    server, _service = build_shard_server(settings)
    server.start()
    try:
        with ShardClient(server.address, make_token()) as client:
            assert client.add("ten bytes!").created
            _refused(lambda: client.add("eleven byte"), reason="CONTENT_TOO_LARGE",
                     setting="ENGRAM_LIMITS_CONTENT_BYTES")
            _refused(lambda: client.search("seventeen bytes!!"),
                     setting="ENGRAM_LIMITS_QUERY_BYTES")
            with pytest.raises(EngramRpcError) as caught:
                client.search("x" * 70_000)
            assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.stop(0)


@pytest.mark.parametrize("word", ["y" * 3000, "ay" * 2000, "by" * 2000 + "ing"])
def test_a_long_word_is_indexed_and_the_next_writes_are_not_hurt(
        client_for: Callable[..., ShardClient], word: str) -> None:
    """The stemmer asked each y's left neighbour recursively: a word of ~1,000 y's raised
    RecursionError in the index, that record was never searchable and another agent's next
    write failed INTERNAL (found in review). Each write here succeeds and is found."""
    long_writer, other = client_for("agent-long"), client_for("agent-other")
    stored = long_writer.add(f"zqlong {word} marker", run_id="long-words")
    after = [other.add(f"zqafter note {i}", run_id="long-words") for i in range(3)]
    hits = long_writer.search("zqlong", mode="lexical")
    assert hits[0].record.id == stored.record.id  # (run neighbours may follow it)
    found = {hit.record.id for hit in other.search("zqafter", mode="lexical", limit=10)}
    assert {created.record.id for created in after} <= found


FLEET_A = "fleet-a"  # the fleet of make_token's default tokens


def test_an_index_change_that_fails_is_counted_and_hurts_no_other_call(
        shard: tuple[str, ShardService], client_for: Callable[..., ShardClient],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whoever takes a fleet next applies the changes handed to it, so a change that raised
    failed that caller (another agent's write: INTERNAL) and was lost unseen. Now it is
    logged, counted (engram_shard_index_change_failures_total) and dropped."""
    from services.shard.search.fleet_index import FleetIndex

    add = FleetIndex.add

    def failing_add(self: FleetIndex, record_id: str, run_id: str, content: str,
                    *args: object) -> None:
        if "zqpoison" in content:
            raise RuntimeError("analysis failed")
        add(self, record_id, run_id, content, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(FleetIndex, "add", failing_add)
    index = shard[1].search_engine.index
    assert index is not None
    poisoner, other = client_for("agent-poison"), client_for("agent-other")
    poisoner.add("zqpoison in this record", run_id="poison")  # stored: acknowledged
    after = [other.add(f"zqafter note {i}", run_id="poison") for i in range(3)]
    found = {hit.record.id for hit in other.search("zqafter", mode="lexical", limit=10)}
    assert {created.record.id for created in after} <= found
    assert sum(count for _, count in index.change_failures.items()) == 1

    # A rebuild of the fleet (here retention's removal of most of it, which is not done in
    # place) meets the same record: it is left out again, and the removal still happens
    # (before, the rebuild raised and the removed records stayed searchable).
    old = [other.add(f"zqold note {i}", run_id="old").record.id for i in range(12)]
    index.sync()
    service = shard[1]
    with service.db.session() as session:
        service.repo.remove(session, FLEET_A, old)
    assert index.forget(FLEET_A, old)
    assert not other.search("zqold", mode="lexical", limit=20)
    assert sum(count for _, count in index.change_failures.items()) == 2


def test_index_change_failures_are_exported_from_zero(shard: tuple[str, ShardService]) -> None:
    """A counter that first appears at 1 never shows an increase to Prometheus, so the alert
    on it would miss a replica's first failure (found in review)."""
    from services.shard.metrics import ShardMetrics

    index = shard[1].search_engine.index
    assert index is not None
    families = {family.name: family for family in ShardMetrics(shard[1], index).collect()}
    samples = families["engram_shard_index_change_failures"].samples
    assert [(sample.name, sample.value) for sample in samples] == [
        ("engram_shard_index_change_failures_total", 0.0)]
