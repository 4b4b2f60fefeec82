"""A write retried concurrently with one request_id: every caller gets the first answer."""

from __future__ import annotations

import grpc

from engram.client import EngramRpcError, ShardClient
from engram.client.shard import record_input
from engram.shard.v1 import shard_service_pb2 as pb
from services.shard.service import ShardService
from tests.integration.races import at_once
from tests.integration.shard.conftest import ClientFactory


def test_concurrent_create_with_one_request_id_all_get_the_first_answer(
        client_for: ClientFactory) -> None:
    clients = [client_for() for _ in range(4)]
    calls = iter(range(10**6))

    def create() -> pb.CreateRecordResponse:
        client: ShardClient = clients[next(calls) % len(clients)]
        return client.add("Retries race; the first answer wins", run_id="run-r",
                          request_id="req-race")

    results = at_once(create)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    ids = {r.record.id for r in results if isinstance(r, pb.CreateRecordResponse)}
    assert len(ids) == 1
    assert len(list(clients[0].list(run_id="run-r"))) == 1


def test_concurrent_batch_with_one_request_id_all_get_the_first_answer(
        client_for: ClientFactory) -> None:
    client = client_for()
    records = [record_input(f"batch memory {n} about retries", run_id="run-b") for n in range(5)]

    results = at_once(lambda: client.add_many(records, request_id="req-batch"))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    answers = {tuple(x.record.id for x in r.results) for r in results
               if isinstance(r, pb.BatchCreateRecordsResponse)}
    assert len(answers) == 1 and len(next(iter(answers))) == 5
    assert len(list(client.list(run_id="run-b"))) == 5


def test_concurrent_reuse_of_a_request_id_for_other_records_is_refused_not_internal(
        client_for: ClientFactory) -> None:
    client = client_for()
    calls = iter(range(10**6))

    def create() -> pb.CreateRecordResponse:
        return client.add(f"different memory number {next(calls)}", run_id="run-u",
                          request_id="req-reused")

    results = at_once(create)
    answers = [r for r in results if isinstance(r, pb.CreateRecordResponse)]
    refused = [r for r in results if isinstance(r, EngramRpcError)]
    assert len(answers) == 1 and len(refused) == len(results) - 1
    assert {(e.code, e.reason) for e in refused} == {
        (grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_ID_REUSED")}
    assert [r.id for r in client.list(run_id="run-u")] == [answers[0].record.id]


def test_the_same_text_written_at_once_under_other_request_ids_is_one_record(
        client_for: ClientFactory) -> None:
    """Format-2 ids are random: the write key, claimed in the commit, makes the racers agree
    (the losers answer with the winner's record, created = false)."""
    clients = [client_for() for _ in range(4)]
    calls = iter(range(10**6))

    def create() -> pb.CreateRecordResponse:
        client: ShardClient = clients[next(calls) % len(clients)]
        return client.add("The same lesson, written by every thread", run_id="run-k")

    results = at_once(create)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    replies = [r for r in results if isinstance(r, pb.CreateRecordResponse)]
    assert len({r.record.id for r in replies}) == 1
    assert sum(r.created for r in replies) == 1
    assert len(list(clients[0].list(run_id="run-k"))) == 1


def test_a_groups_request_ids_are_claimed_together_and_the_first_claim_wins(
        shard: tuple[str, ShardService]) -> None:
    """claim_requests: one multi-row insert; a key claimed earlier, or twice in the same group,
    reports the digest stored first; the others are stored (SQLite and Postgres alike)."""
    from services.shard.repository import RequestClaim

    _, service = shard
    repo, db = service.repo, service.db
    with db.session() as session:
        assert repo.claim_requests(session, [
            RequestClaim("fleet-c", "agent-c", "req-old", "digest-old", ["r0"])], 1) == {}
    claims = [RequestClaim("fleet-c", "agent-c", "req-1", "digest-1", ["r1"]),
              RequestClaim("fleet-c", "agent-c", "req-old", "digest-new", ["r2"]),
              RequestClaim("fleet-c", "agent-c", "req-1", "digest-1b", ["r3"]),
              RequestClaim("fleet-c", "agent-d", "req-1", "digest-d", ["r4"])]
    with db.session() as session:
        taken = repo.claim_requests(session, claims, 2)
    assert taken == {("fleet-c", "agent-c", "req-old"): "digest-old",
                     ("fleet-c", "agent-c", "req-1"): "digest-1"}
    with db.session() as session:
        assert repo.find_request(session, "fleet-c", "agent-c", "req-1") == ("digest-1", ["r1"])
        assert repo.find_request(session, "fleet-c", "agent-d", "req-1") == ("digest-d", ["r4"])
        many = [RequestClaim("fleet-c", "agent-m", f"req-{n}", f"d{n}", [f"m{n}"])
                for n in range(700)]  # more than one statement's rows
        assert repo.claim_requests(session, many, 3) == {}
        assert repo.find_request(session, "fleet-c", "agent-m", "req-699") == ("d699", ["m699"])


def test_replicas_claiming_overlapping_keys_in_other_orders_do_not_deadlock(
        fresh_postgres_url: str) -> None:
    """Two replicas' groups claim write keys and request ids that overlap, listed in other
    orders. Postgres inserts a statement's rows in order and waits on a key an uncommitted
    transaction holds, so a group that took key b and waits for a, beside one that took a and
    waits for b, was a deadlock (40P01: one group's writes failed). Claims go in key order:
    the second group waits before it takes anything. Replayed here step by step (two
    statements stand for one group's rows as the race interleaves them)."""
    import threading
    import time

    from services.common.db import Database
    from services.shard.repository import RequestClaim, ShardRepository
    from services.shard.server import MIGRATIONS

    db = Database(fresh_postgres_url)
    try:
        db.upgrade(MIGRATIONS)
        repo = ShardRepository(db.dialect)
        errors: list[BaseException] = []
        lost: dict[str, dict[str, str]] = {}
        taken: dict[str, dict[tuple[str, str, str], str]] = {}

        def claim(replica: str, keys: list[str], requests: list[str]) -> tuple[
                dict[str, str], dict[tuple[str, str, str], str]]:
            with db.session() as session:
                return (repo.claim_write_keys(session, [("f", f"{replica}-{k}", k) for k in keys]),
                        repo.claim_requests(session, [RequestClaim("f", "a", r, replica, [])
                                                      for r in requests], 1))

        def second() -> None:  # takes "k-b" and "req-b" first unless claims are sorted
            try:
                lost["two"], taken["two"] = claim("two", ["k-b", "k-a"], ["req-b", "req-a"])
            except BaseException as error:  # 40P01 without the fix
                errors.append(error)

        with db.session() as first:
            repo.claim_write_keys(first, [("f", "one-k-a", "k-a")])
            repo.claim_requests(first, [RequestClaim("f", "a", "req-a", "one", [])], 1)
            other = threading.Thread(target=second)
            other.start()
            time.sleep(0.5)  # the second replica now waits for "k-a"
            try:
                assert repo.claim_write_keys(first, [("f", "one-k-b", "k-b")]) == {}
                assert repo.claim_requests(
                    first, [RequestClaim("f", "a", "req-b", "one", [])], 1) == {}
            except BaseException:
                first.rollback()
                raise
        other.join(30)
        assert not errors, errors
        assert lost["two"] == {"two-k-a": "one-k-a", "two-k-b": "one-k-b"}
        assert taken["two"] == {("f", "a", "req-a"): "one", ("f", "a", "req-b"): "one"}
    finally:
        db.dispose()
