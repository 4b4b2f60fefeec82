"""Export's walk down a run's cold snapshots (engram/bundle/export.py)."""

from __future__ import annotations

from typing import Any, cast

import grpc

from engram.bundle.export import Clients, Exporter
from engram.client import EngramRpcError
from engram.compactor.v1 import compactor_service_pb2 as cpb


class _Compactor:
    """A run of 30 iterations: 21-30 hot, a snapshot at 20, one pinned at 3, and the trail
    from 3 up past the limit (here 10 lines) refused as the service refuses it."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def recent(self, run: str, page_size: int = 0) -> list[cpb.HotIteration]:
        return [cpb.HotIteration(summary=cpb.IterationSummary(iteration=n),
                                 detail_json=f'{{"n": {n}}}') for n in range(30, 20, -1)]

    def reconstruct(self, run: str, iteration: int) -> cpb.ReconstructIterationResponse:
        self.asked.append(iteration)
        base = 20 if iteration >= 20 else 3 if iteration >= 3 else 0
        if not base:
            return cpb.ReconstructIterationResponse(
                summary=cpb.IterationSummary(iteration=iteration),
                source=cpb.DETAIL_SOURCE_SUMMARY_ONLY)
        if iteration - base > 10:
            raise EngramRpcError(grpc.StatusCode.FAILED_PRECONDITION, "trail too long",
                                 "TRAIL_TOO_LONG", {"base_iteration": str(base)})
        source = (cpb.DETAIL_SOURCE_COLD_SNAPSHOT if iteration == base
                  else cpb.DETAIL_SOURCE_BASE_SNAPSHOT)
        return cpb.ReconstructIterationResponse(
            summary=cpb.IterationSummary(iteration=iteration), source=source,
            base_iteration=base, detail_json=f'{{"n": {base}}}')


def test_a_snapshot_pinned_far_back_is_exported_past_the_trail_limit() -> None:
    """Found by review (2026-11-30): a pinned snapshot more than MAX_TRAIL iterations below
    the others made ReconstructIteration FAILED_PRECONDITION TRAIL_TOO_LONG, which aborted
    the whole export; it now goes on from the snapshot the refusal names."""
    compactor = _Compactor()
    clients = Clients(shard=cast(Any, None), governance=cast(Any, None),
                      artifacts=cast(Any, None), compactor=cast(Any, compactor))
    details = Exporter(clients)._iteration_details("run-1", 30)
    assert sorted(details) == [3, *range(20, 31)]
    assert details[3] == ('{"n": 3}', "")
    assert compactor.asked == [20, 19, 3, 2]
