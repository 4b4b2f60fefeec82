"""Concurrent records share one transaction: one group, several runs, per-request outcomes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import psycopg
import pytest
import sqlalchemy

from services.common.errors import FailedPrecondition
from services.common.storage_errors import storage_error
from services.compactor.domain.model import AppendRequest
from services.compactor.domain.warm_chain import canonical_detail_digest, detail_digest
from tests.unit.compactor.support import LogFactory, make_iteration


def _request(run_id: str, n: int, iteration: int | None = None) -> AppendRequest:
    item = make_iteration(n).validated()
    if iteration is not None:
        item = replace(item, iteration=iteration)
    return AppendRequest("fleet-a", run_id, item,
                         canonical_detail_digest(item.detail_json, item.guardrails_json))


def test_canonical_digest_equals_the_parsing_one() -> None:
    item = make_iteration(7, size=500).validated()
    assert canonical_detail_digest(item.detail_json, item.guardrails_json) == detail_digest(
        item.detail_json, item.guardrails_json)


def test_one_group_appends_several_runs_and_keeps_each_outcome_apart(
        make_log: LogFactory) -> None:
    log = make_log(hot_size=2, snapshot_every=2)
    log.record("fleet-a", "run-a", make_iteration(1))
    group = [
        _request("run-a", 2),
        _request("run-b", 1),
        _request("run-b", 3),           # a gap: refused alone
        _request("run-a", 0, iteration=0),  # "next" after 2 in the same group: 3
        _request("run-a", 1),           # already recorded
    ]
    outcomes = log.repo.append_group(group, log._plan)
    assert [o.plan.line.iteration if o.plan else None for o in outcomes] == [2, 1, None, 3, None]
    assert isinstance(outcomes[2].error, FailedPrecondition)
    assert outcomes[4].error is None and not outcomes[4].retry
    assert outcomes[0].plan and outcomes[0].plan.snapshot  # iteration 2: snapshot bookkeeping
    assert outcomes[3].plan and outcomes[3].plan.line.prev_hash == outcomes[0].plan.line.hash
    for run_id, last in (("run-a", 3), ("run-b", 1)):
        log.finish_pending("fleet-a", run_id)
        assert log.verify("fleet-a", run_id).ok
        assert log.last_iteration("fleet-a", run_id) == last
    assert [e.line.iteration for e in log.repo.recent("fleet-a", "run-a", None, 10)] == [3, 2]


def test_concurrent_records_from_threads_all_land_once(make_log: LogFactory) -> None:
    log = make_log(rotate_bytes=3000, snapshot_every=5, hot_size=3)
    runs, per_run = 4, 15
    errors: list[BaseException] = []

    def writer(run: int) -> None:
        try:
            for n in range(per_run):
                item = replace(make_iteration(run * 100 + n), iteration=0)  # 0 = next
                log.record("fleet-a", f"run-{run % 2}", item)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for run_id in ("run-0", "run-1"):
        assert log.last_iteration("fleet-a", run_id) == per_run * 2
        report = log.verify("fleet-a", run_id)
        assert report.ok, report.problems
        assert report.lines_checked == per_run * 2


def test_a_group_committed_without_its_acknowledgement_is_not_appended_again(
        make_log: LogFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Postgres committed a group of "next iteration" appends (no request id) and the
    connection dropped before the acknowledgement: the group failed, each append was tried
    again alone and recorded a second time (found by review, 2026-11-30). The group's
    appends now fail UNAVAILABLE (the outcome is unknown) and are recorded once."""
    log = make_log(hot_size=50, snapshot_every=50)
    append_group = log.repo.append_group
    calls: list[int] = []
    held = threading.Event()

    def lost_acknowledgement(requests: Sequence[AppendRequest], plan: Any) -> list[Any]:
        calls.append(len(requests))
        if len(calls) == 1:  # the first leads alone; the next two queue behind it
            assert held.wait(10)
        outcomes = append_group(requests, plan)
        if len(calls) == 2:  # the group of two: committed, then the connection dropped
            raise sqlalchemy.exc.OperationalError(
                "COMMIT", {}, psycopg.OperationalError("server closed the connection"))
        return outcomes

    monkeypatch.setattr(log.repo, "append_group", lost_acknowledgement)
    errors: list[BaseException] = []

    def record(n: int) -> None:
        try:
            log.record("fleet-a", "run-a", replace(make_iteration(n), iteration=0))
        except BaseException as error:  # asserted below
            errors.append(error)

    first = threading.Thread(target=record, args=(1,))
    first.start()
    _until(lambda: bool(calls), "the first append never reached the store")
    others = [threading.Thread(target=record, args=(n,)) for n in (2, 3)]
    for thread in others:
        thread.start()
    _until(lambda: len(log._appends._queue) == 2, "the other appends never queued")
    held.set()
    for thread in (first, *others):
        thread.join(10)
    assert calls == [1, 2], "the group's appends were tried again alone"
    assert [storage_error(e).reason for e in errors] == ["DATABASE_UNAVAILABLE"] * 2
    log.finish_pending("fleet-a", "run-a")
    assert log.last_iteration("fleet-a", "run-a") == 3  # once each, not 5
    assert log.verify("fleet-a", "run-a").ok


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
