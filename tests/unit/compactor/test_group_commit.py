"""Concurrent records share one transaction: one group, several runs, per-request outcomes."""

from __future__ import annotations

import threading
from dataclasses import replace

from services.common.errors import FailedPrecondition
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
