"""Python SDK for the compactor service.

    from engram.client import ClientSettings
    from engram.client.compactor import CompactorClient, iteration_from_json
    settings = ClientSettings()
    with CompactorClient(settings.compactor_addr, settings.resolve_token()) as compactor:
        compactor.record("run-7", iteration_from_json(json.load(open("iter.json"))))
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property

from google.protobuf.timestamp_pb2 import Timestamp

from engram.client._channel import BaseClient, idempotency_key
from engram.compactor.v1 import compactor_service_pb2 as pb
from engram.compactor.v1 import compactor_service_pb2_grpc as pb_grpc

POLICY_RUN_SECONDS = 300.0
"""The least deadline of an on-demand compaction or retention run: the compactor itself waits
up to 60 s for each shard call (ENGRAM_COMPACTOR_SHARD_TIMEOUT_SECONDS), and a run cut short
by the caller's deadline (30 s by default) still finished and was recorded as succeeded while
the caller was told DEADLINE_EXCEEDED."""

_SUMMARY_FIELDS = {
    "iter": "iteration", "planDigest": "plan_digest", "parentDigest": "parent_digest",
    "filesTouched": "files_touched", "netAdd": "net_add", "netDel": "net_del",
    "riskScore": "risk_score", "status": "status",
}


def _timestamp(value: object, name: str) -> Timestamp:
    stamp = Timestamp()
    try:
        if isinstance(value, int | float):
            stamp.FromNanoseconds(int(value * 1e9))
        else:
            stamp.FromJsonString(str(value))
    except ValueError:
        raise ValueError(f"{name} must be an RFC 3339 time (2025-08-14T12:00:00Z) or "
                         f"epoch seconds, got {value!r}") from None
    return stamp


def iteration_from_json(document: Mapping[str, object]) -> pb.IterationInput:
    """Build an iteration from its JSON document: the summary fields in camelCase (iter,
    planDigest, parentDigest, startTs, endTs, filesTouched, netAdd, netDel, riskScore,
    status), plus ``detail`` (the full detail) and ``guardrails`` (guardrail stage outputs)."""
    message = pb.IterationInput()
    for key, field in _SUMMARY_FIELDS.items():
        if key in document:
            setattr(message, field, type(getattr(message, field))(document[key]))
    for key, field in (("startTs", "start_time"), ("endTs", "end_time")):
        if key in document:
            getattr(message, field).CopyFrom(_timestamp(document[key], key))
    message.detail_json = json.dumps(document.get("detail"), sort_keys=True)
    message.guardrails_json = json.dumps(document.get("guardrails"), sort_keys=True)
    return message


class CompactorClient(BaseClient):
    """``CompactorClient(target, token)``; every method raises ``EngramRpcError`` on failure."""

    @cached_property
    def stub(self) -> pb_grpc.CompactorServiceStub:
        return pb_grpc.CompactorServiceStub(self.channel)

    def record(self, run_id: str, iteration: pb.IterationInput, *,
               request_id: str = "") -> pb.RecordIterationResponse:
        """Append one iteration; pass ``request_id`` so a retry of iteration 0 ("next") is safe."""
        reply: pb.RecordIterationResponse = self.call(
            self.stub.RecordIteration, pb.RecordIterationRequest(
                run_id=run_id, iteration=iteration, request_id=idempotency_key(request_id)))
        return reply

    def import_iterations(
            self, run_id: str,
            iterations: Sequence[pb.ImportedIteration]) -> pb.ImportIterationsResponse:
        """Iterations of another instance, in order, kept as they were (admin; import-bundle)."""
        reply: pb.ImportIterationsResponse = self.call(
            self.stub.ImportIterations,
            pb.ImportIterationsRequest(run_id=run_id, iterations=iterations))
        return reply

    def recent(self, run_id: str, page_size: int = 0) -> Iterator[pb.HotIteration]:
        """The hot ring, newest first."""
        request = pb.ListRecentIterationsRequest(run_id=run_id, page_size=page_size)
        return self.paginate(self.stub.ListRecentIterations, request,
                             lambda reply: reply.iterations)

    def summaries(self, run_id: str, start_iteration: int = 0,
                  page_size: int = 0) -> Iterator[pb.IterationSummary]:
        """Every warm summary from ``start_iteration`` on, following page tokens."""
        request = pb.ListSummariesRequest(run_id=run_id, start_iteration=start_iteration,
                                          page_size=page_size)
        return self.paginate(self.stub.ListSummaries, request, lambda reply: reply.summaries)

    def reconstruct(self, run_id: str, iteration: int) -> pb.ReconstructIterationResponse:
        reply: pb.ReconstructIterationResponse = self.call(
            self.stub.ReconstructIteration,
            pb.ReconstructIterationRequest(run_id=run_id, iteration=iteration))
        return reply

    def pin(self, run_id: str, iteration: int, reason: str) -> pb.Pin:
        reply: pb.PinIterationResponse = self.call(self.stub.PinIteration, pb.PinIterationRequest(
            run_id=run_id, iteration=iteration, reason=reason))
        return reply.pin

    def verify(self, run_id: str) -> pb.VerifyRunResponse:
        reply: pb.VerifyRunResponse = self.call(self.stub.VerifyRun,
                                                pb.VerifyRunRequest(run_id=run_id))
        return reply

    def find_iteration_logs(self, match: str, limit: int = 0,
                            page_token: str = "") -> pb.FindIterationLogsResponse:
        """One page of the runs whose iteration log holds ``match`` (governor or admin
        role); ``next_page_token`` lists the rest."""
        return self.call(self.stub.FindIterationLogs, pb.FindIterationLogsRequest(
            match=match, limit=limit, page_token=page_token))

    def forget_iterations(self, erasure_id: str) -> pb.ForgetIterationsResponse:
        """Erase the iteration logs governance's erasure of that id lists (governor, admin)."""
        return self.call(self.stub.ForgetIterations,
                         pb.ForgetIterationsRequest(erasure_id=erasure_id))

    def compact_memory(self, fleet_id: str = "", *, dry_run: bool = False,
                       importance_below: float | None = None,
                       older_than_days: float | None = None) -> pb.PolicyRun:
        request = pb.CompactMemoryRequest(fleet_id=fleet_id, dry_run=dry_run)
        if importance_below is not None:
            request.importance_below = importance_below
        if older_than_days is not None:
            request.older_than_days = older_than_days
        reply: pb.CompactMemoryResponse = self.call(self.stub.CompactMemory, request,
                                                    timeout=self._policy_deadline())
        return reply.run

    def apply_retention(self, fleet_id: str = "", *, older_than_days: float,
                        dry_run: bool = False) -> pb.PolicyRun:
        reply: pb.ApplyMemoryRetentionResponse = self.call(
            self.stub.ApplyMemoryRetention, pb.ApplyMemoryRetentionRequest(
                fleet_id=fleet_id, older_than_days=older_than_days, dry_run=dry_run),
            timeout=self._policy_deadline())
        return reply.run

    def _policy_deadline(self) -> float | None:
        """The client's timeout, at least POLICY_RUN_SECONDS (none: none)."""
        return None if self.timeout is None else max(self.timeout, POLICY_RUN_SECONDS)

    def policy_runs(self, fleet_id: str = "", page_size: int = 0) -> Iterator[pb.PolicyRun]:
        """Memory compaction and retention runs, newest first, following page tokens."""
        request = pb.ListPolicyRunsRequest(fleet_id=fleet_id, page_size=page_size)
        return self.paginate(self.stub.ListPolicyRuns, request, lambda reply: reply.runs)
