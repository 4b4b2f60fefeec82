"""RecordIteration retried concurrently with one request_id: every caller gets the first answer."""

from __future__ import annotations

import pytest

from engram.compactor.v1 import compactor_service_pb2 as pb
from tests.integration.compactor.conftest import CompactorFactory
from tests.integration.compactor.test_compactor_contract import iteration
from tests.integration.races import at_once


@pytest.mark.parametrize("before", [0, 2], ids=["new-run", "existing-run"])
def test_concurrent_record_with_one_request_id_records_one_iteration(
        compactor_for: CompactorFactory, before: int) -> None:
    clients = [compactor_for() for _ in range(4)]
    for n in range(1, before + 1):
        clients[0].record("run-race", iteration(n))
    calls = iter(range(10**6))
    following = iteration(before + 1)
    following.iteration = 0  # "the next one": only the request_id makes a retry safe

    def record() -> pb.RecordIterationResponse:
        return clients[next(calls) % len(clients)].record("run-race", following,
                                                          request_id="req-race")

    results = at_once(record)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    hashes = {r.summary.hash for r in results if isinstance(r, pb.RecordIterationResponse)}
    assert len(hashes) == 1
    assert sum(r.created for r in results if isinstance(r, pb.RecordIterationResponse)) == 1
    assert [s.iteration for s in clients[0].summaries("run-race")] == list(range(1, before + 2))
