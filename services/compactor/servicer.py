"""CompactorService: domain <-> proto at the edge; runs are scoped by the caller's fleet."""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from engram.compactor.v1 import compactor_service_pb2 as pb
from engram.compactor.v1 import compactor_service_pb2_grpc as pb_grpc
from services.common.admission import READ, WRITE, MethodKinds
from services.common.auth import PEOPLE, MethodPolicy, current_principal, target_fleet
from services.common.errors import FailedPrecondition
from services.common.find_cursor import FindCursor, scan_filters
from services.common.pagination import PageTokens
from services.common.timestamps import time_us
from services.common.tokens import validate_identifier
from services.common.tombstone_audit import BESIDE_LIVE_LOG
from services.compactor.domain.memory_policy import KIND_COMPACT, PolicyRun
from services.compactor.domain.model import DetailSource, Pin, Reconstruction
from services.compactor.domain.warm_chain import IterationInput, WarmLine
from services.compactor.erasure import IterationEraser
from services.compactor.service import (
    ImportedIteration,
    IterationLog,
    MemoryPolicyRunner,
    check_tombstone_form,
)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CompactorService"].full_name
_WRITERS = frozenset({"agent", "admin"})  # no service calls the compactor
_OPERATORS = frozenset({"admin"})


def _m(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


POLICY: MethodPolicy = {
    _m("RecordIteration"): _WRITERS,
    # Keeps the origin's lines and hashes: an admin's act, like the other imports.
    _m("ImportIterations"): _OPERATORS,
    _m("PinIteration"): _WRITERS,
    _m("ListRecentIterations"): PEOPLE,
    _m("ListSummaries"): PEOPLE,
    _m("ReconstructIteration"): PEOPLE,
    _m("VerifyRun"): PEOPLE,
    _m("CompactMemory"): _OPERATORS,
    _m("ApplyMemoryRetention"): _OPERATORS,
    _m("ListPolicyRuns"): frozenset({"admin", "governor"}),
    _m("ForgetIterations"): frozenset({"admin", "governor"}),  # erasure: a governance act
    _m("FindIterationLogs"): frozenset({"admin", "governor"}),
}
assert set(POLICY) == {
    _m(m.name) for m in pb.DESCRIPTOR.services_by_name["CompactorService"].methods
}
KINDS: MethodKinds = {  # which rate limit each RPC counts against
    **{_m(name): WRITE for name in (
        "RecordIteration", "PinIteration", "CompactMemory", "ApplyMemoryRetention",
        "ForgetIterations", "ImportIterations")},
    **{_m(name): READ for name in (
        "ListRecentIterations", "ListSummaries", "ReconstructIteration", "VerifyRun",
        "ListPolicyRuns", "FindIterationLogs")},
}
assert set(KINDS) == set(POLICY)

_SOURCES = {
    DetailSource.HOT: pb.DETAIL_SOURCE_HOT,
    DetailSource.COLD_SNAPSHOT: pb.DETAIL_SOURCE_COLD_SNAPSHOT,
    DetailSource.BASE_SNAPSHOT: pb.DETAIL_SOURCE_BASE_SNAPSHOT,
    DetailSource.SUMMARY_ONLY: pb.DETAIL_SOURCE_SUMMARY_ONLY,
}


def _timestamp_text(message: pb.IterationInput | pb.IterationSummary, field: str) -> str:
    if not message.HasField(field):
        return ""
    value: Timestamp = getattr(message, field)
    time_us(value, field)  # ToJsonString raises (INTERNAL) outside 0001..9999
    return value.ToJsonString()


def _timestamp(text: str) -> Timestamp | None:
    if not text:
        return None
    stamp = Timestamp()
    try:
        stamp.FromJsonString(text)
    except ValueError:
        return None
    return stamp


def _us_timestamp(us: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMicroseconds(us)
    return stamp


def summary_pb(line: WarmLine) -> pb.IterationSummary:
    if line.erased:
        return pb.IterationSummary(
            iteration=line.iteration, detail_digest=line.detail_digest,
            prev_hash=line.prev_hash, hash=line.hash, format=line.format,
            summary_commitment=line.summary_commitment, erasure_id=line.erasure_id,
            erase_time=_us_timestamp(line.erased_us), erased_by=line.erased_by)
    return pb.IterationSummary(
        iteration=line.iteration, plan_digest=line.plan_digest, parent_digest=line.parent_digest,
        start_time=_timestamp(line.start_ts), end_time=_timestamp(line.end_ts),
        files_touched=line.files_touched, net_add=line.net_add, net_del=line.net_del,
        risk_score=line.risk_score, status=line.status, detail_digest=line.detail_digest,
        prev_hash=line.prev_hash, hash=line.hash, format=line.format, salt=line.salt,
        summary_commitment=line.summary_commitment)


def summary_line(summary: pb.IterationSummary) -> WarmLine:
    """A summary as the warm line it came from (times in the text the line holds); a tombstone
    (``erasure_id`` set) as one, whatever else it carries."""
    if summary.erasure_id:
        return WarmLine.erased_line(
            summary.iteration, summary.detail_digest, summary.prev_hash, summary.hash,
            summary.summary_commitment, summary.erasure_id, _erased_us(summary),
            summary.erased_by, line_format=summary.format or 1)
    return WarmLine(
        iteration=summary.iteration, plan_digest=summary.plan_digest,
        parent_digest=summary.parent_digest, start_ts=_timestamp_text(summary, "start_time"),
        end_ts=_timestamp_text(summary, "end_time"), files_touched=summary.files_touched,
        net_add=summary.net_add, net_del=summary.net_del, risk_score=summary.risk_score,
        status=summary.status, detail_digest=summary.detail_digest,
        prev_hash=summary.prev_hash, hash=summary.hash,
        format=summary.format or 1,  # 0: a bundle made before formats were carried
        salt=summary.salt, summary_commitment=summary.summary_commitment,
        # a tombstone's fields without its erasure: kept so that an import refuses them
        erased_us=_erased_us(summary), erased_by=summary.erased_by)


def _erased_us(summary: pb.IterationSummary) -> int:
    """The summary's erase time; INVALID_ARGUMENT INVALID_TOMBSTONE outside 0001..9999 (was
    INTERNAL: found by review)."""
    if not summary.HasField("erase_time"):
        return 0
    return time_us(summary.erase_time, "erase_time", reason="INVALID_TOMBSTONE")


def pin_pb(pin: Pin) -> pb.Pin:
    return pb.Pin(iteration=pin.iteration, reason=pin.reason,
                  snapshot_iteration=pin.snapshot_iteration,
                  create_time=_us_timestamp(pin.created_us))


def policy_run_pb(run: PolicyRun) -> pb.PolicyRun:
    return pb.PolicyRun(
        id=run.id, fleet_id=run.fleet_id,
        kind=pb.POLICY_KIND_COMPACT if run.kind == KIND_COMPACT else pb.POLICY_KIND_RETENTION,
        dry_run=run.dry_run, trigger=run.trigger, outcome=run.outcome, error=run.error,
        examined=run.examined, compacted=run.compacted,
        groups=[pb.CompactedGroup(summary_id=g.summary_id, replaced_ids=g.replaced_ids,
                                  replaced_hashes=g.replaced_hashes, domain=g.domain,
                                  run_id=g.run_id) for g in run.groups],
        removed_ids=run.removed_ids, importance_below=run.importance_below,
        older_than_days=run.older_than_days, start_time=_us_timestamp(run.start_us),
        end_time=_us_timestamp(run.end_us))


def reconstruction_pb(view: Reconstruction) -> pb.ReconstructIterationResponse:
    return pb.ReconstructIterationResponse(
        summary=summary_pb(view.summary), source=_SOURCES[view.source],
        detail_json=view.detail_json, guardrails_json=view.guardrails_json,
        base_iteration=view.base_iteration, trail=[summary_pb(x) for x in view.trail])


RECENT_PAGE_BYTES = 16 * 1024 * 1024
"""What one ListRecentIterations page holds at most (the SDK receives up to 64 MiB)."""


def _run_id(run_id: str) -> str:
    return validate_identifier("run_id", run_id)


def _policy_fleet(requested: str) -> str:
    """The caller's own fleet: no principal runs memory policies for another fleet here."""
    return target_fleet(current_principal(), requested)


ERASURE_READERS = frozenset({"governor", "admin"})
"""Who sees the head an erased log's tombstone kept (those who may read erasures)."""


class CompactorServicer(pb_grpc.CompactorServiceServicer):
    def __init__(self, log: IterationLog, policies: MemoryPolicyRunner,
                 pages: PageTokens | None = None, eraser: IterationEraser | None = None) -> None:
        self._log = log
        self._policies = policies
        self._pages = pages or PageTokens.ephemeral()
        self._eraser = eraser

    def FindIterationLogs(self, request: pb.FindIterationLogsRequest,
                          context: grpc.ServicerContext) -> pb.FindIterationLogsResponse:
        if self._eraser is None:
            raise FailedPrecondition("this compactor cannot search for erasure",
                                     reason="GOVERNANCE_REQUIRED")
        fleet_id = current_principal().fleet_id
        filters = scan_filters("iteration_logs", fleet_id, request.match)
        found, following = self._eraser.find(
            fleet_id, request.match, request.limit, context.is_active,
            FindCursor.from_key(self._pages.decode(request.page_token, filters)))
        return pb.FindIterationLogsResponse(runs=[pb.FoundIterationLog(
            run_id=r.run_id, head_hash=r.head_hash, last_iteration=r.last_iteration,
            iterations=[pb.FoundIteration(iteration=i.iteration, leaf_hash=i.leaf_hash,
                                          format=i.format) for i in r.iterations],
            whole_log_needed=r.whole_log_needed) for r in found], more=following is not None,
            next_page_token=self._pages.encode(following.key(), filters) if following else "")

    def ForgetIterations(self, request: pb.ForgetIterationsRequest,
                         context: grpc.ServicerContext) -> pb.ForgetIterationsResponse:
        if self._eraser is None:
            raise FailedPrecondition("this compactor cannot erase (built without a blob store "
                                     "and governance)", reason="GOVERNANCE_REQUIRED")
        done = self._eraser.erase(current_principal().fleet_id, request.erasure_id,
                                  int(time.time() * 1_000_000))
        return pb.ForgetIterationsResponse(runs=[pb.ForgottenIterations(
            run_id=r.run_id, last_iteration=r.last_iteration, head_hash=r.head_hash,
            blobs=r.blobs) for r in done.logs], already_erased=done.already,
            iterations_erased=done.iterations)

    def RecordIteration(self, request: pb.RecordIterationRequest,
                        context: grpc.ServicerContext) -> pb.RecordIterationResponse:
        fleet = current_principal().fleet_id
        it = request.iteration
        item = IterationInput(
            iteration=it.iteration, plan_digest=it.plan_digest, parent_digest=it.parent_digest,
            start_ts=_timestamp_text(it, "start_time"), end_ts=_timestamp_text(it, "end_time"),
            files_touched=it.files_touched, net_add=it.net_add, net_del=it.net_del,
            risk_score=it.risk_score, status=it.status, detail_json=it.detail_json,
            guardrails_json=it.guardrails_json)
        result = self._log.record(fleet, _run_id(request.run_id), item, request.request_id)
        return pb.RecordIterationResponse(summary=summary_pb(result.line),
                                          created=result.created)

    def ImportIterations(self, request: pb.ImportIterationsRequest,
                         context: grpc.ServicerContext) -> pb.ImportIterationsResponse:
        fleet, run_id = current_principal().fleet_id, _run_id(request.run_id)
        items = [ImportedIteration(summary_line(it.summary), it.detail_json, it.guardrails_json)
                 for it in request.iterations]
        for item in items:
            check_tombstone_form(item.line)
        if any(item.line.erased for item in items):
            if self._eraser is None:
                raise FailedPrecondition("this compactor cannot check an erased iteration "
                                         "against governance", reason="GOVERNANCE_REQUIRED")
            self._eraser.check_tombstones(fleet, run_id, [item.line for item in items])
        created, present = self._log.import_iterations(fleet, run_id, items)
        return pb.ImportIterationsResponse(created=created, already_present=present)

    def ListRecentIterations(self, request: pb.ListRecentIterationsRequest,
                             context: grpc.ServicerContext) -> pb.ListRecentIterationsResponse:
        fleet = current_principal().fleet_id
        run_id = _run_id(request.run_id)
        # A detail and its guardrails may each be ENGRAM_LIMITS_JSON_BYTES (4 MiB): a page
        # of 1,000 of them was far past any message limit, so a page stops at a byte budget
        # too (its first iteration always goes).
        rows, token = self._pages.paginate(
            request.page_token, request.page_size, {"run": run_id, "fleet": fleet},
            lambda below, limit: self._log.recent(fleet, run_id,
                                                  int(below[0]) if below else None, limit),
            lambda row: [row[0].iteration],
            lambda row: len(row[1]) + len(row[2]) + 1024, RECENT_PAGE_BYTES)
        return pb.ListRecentIterationsResponse(
            iterations=[pb.HotIteration(summary=summary_pb(line), detail_json=detail,
                                        guardrails_json=guard) for line, detail, guard in rows],
            next_page_token=token)

    def ListSummaries(self, request: pb.ListSummariesRequest,
                      context: grpc.ServicerContext) -> pb.ListSummariesResponse:
        fleet = current_principal().fleet_id
        run_id = _run_id(request.run_id)
        last_iter = self._log.last_iteration(fleet, run_id)

        def fetch(after: list[Any] | None, limit: int) -> list[WarmLine]:
            first = int(after[0]) + 1 if after else max(1, request.start_iteration)
            end = min(first + limit - 1, last_iter)
            return self._log.summaries(fleet, run_id, first, end) if first <= end else []

        lines, token = self._pages.paginate(
            request.page_token, request.page_size,
            {"run": run_id, "fleet": fleet, "start": request.start_iteration},
            fetch, lambda line: [line.iteration])
        return pb.ListSummariesResponse(summaries=[summary_pb(x) for x in lines],
                                        next_page_token=token)

    def ReconstructIteration(self, request: pb.ReconstructIterationRequest,
                             context: grpc.ServicerContext) -> pb.ReconstructIterationResponse:
        fleet = current_principal().fleet_id
        return reconstruction_pb(self._log.reconstruct(fleet, _run_id(request.run_id),
                                                       request.iteration))

    def PinIteration(self, request: pb.PinIterationRequest,
                     context: grpc.ServicerContext) -> pb.PinIterationResponse:
        fleet = current_principal().fleet_id
        pin = self._log.pin(fleet, _run_id(request.run_id), request.iteration, request.reason)
        return pb.PinIterationResponse(pin=pin_pb(pin))

    def VerifyRun(self, request: pb.VerifyRunRequest,
                  context: grpc.ServicerContext) -> pb.VerifyRunResponse:
        caller = current_principal()
        fleet = caller.fleet_id
        run_id = _run_id(request.run_id)
        erased = self._eraser.erased_log(fleet, run_id) if self._eraser is not None else None
        if erased is not None and not erased.live:  # its tombstone, as its erasure lists it
            # The kept head of a format-1 log is a hash over its content: it confirms a guess
            # of the erased text, so only those who may read erasures (GetErasure) see it.
            shown = caller.has_any(ERASURE_READERS)
            return pb.VerifyRunResponse(
                ok=not erased.problems, erased=True, erasure_id=erased.erasure_id,
                last_iteration=erased.last_iteration if shown else 0,
                head_hash=erased.head_hash if shown else "",
                tombstones_unconfirmed=erased.unconfirmed,
                problems=[pb.VerifyProblem(location=loc, detail=detail)
                          for loc, detail in erased.problems])
        report = self._log.verify(fleet, run_id)
        problems, unconfirmed = list(report.problems), 0
        if erased is not None:  # a tombstone beside a log still recorded: one must be wrong
            problems.append(("log tombstone", f"erasure {erased.erasure_id} erased this log, "
                             f"yet it is still recorded ({BESIDE_LIVE_LOG})"))
            self._log.integrity_failures.add(BESIDE_LIVE_LOG)
        if report.tombstones:
            if self._eraser is None:
                unconfirmed = len(report.tombstones)
            else:
                found, unconfirmed = self._eraser.audit(fleet, run_id, report.tombstones)
                problems += found
                self._log.integrity_failures.add("TOMBSTONE_NOT_IN_ERASURE", amount=len(found))
        return pb.VerifyRunResponse(
            ok=not problems, lines_checked=report.lines_checked,
            segments_checked=report.segments_checked,
            snapshots_checked=report.snapshots_checked, last_iteration=report.last_iteration,
            head_hash=report.head_hash, tombstoned=report.tombstoned,
            tombstones_unconfirmed=unconfirmed,
            problems=[pb.VerifyProblem(location=loc, detail=detail)
                      for loc, detail in problems])

    def CompactMemory(self, request: pb.CompactMemoryRequest,
                      context: grpc.ServicerContext) -> pb.CompactMemoryResponse:
        fleet = _policy_fleet(request.fleet_id)
        run = self._policies.compact(
            fleet, current_principal().agent_id, dry_run=request.dry_run,
            importance_below=(request.importance_below
                              if request.HasField("importance_below") else None),
            older_than_days=(request.older_than_days
                             if request.HasField("older_than_days") else None))
        return pb.CompactMemoryResponse(run=policy_run_pb(run))

    def ApplyMemoryRetention(self, request: pb.ApplyMemoryRetentionRequest,
                             context: grpc.ServicerContext) -> pb.ApplyMemoryRetentionResponse:
        fleet = _policy_fleet(request.fleet_id)
        run = self._policies.apply_retention(fleet, current_principal().agent_id,
                                             older_than_days=request.older_than_days,
                                             dry_run=request.dry_run)
        return pb.ApplyMemoryRetentionResponse(run=policy_run_pb(run))

    def ListPolicyRuns(self, request: pb.ListPolicyRunsRequest,
                       context: grpc.ServicerContext) -> pb.ListPolicyRunsResponse:
        fleet = _policy_fleet(request.fleet_id)
        runs, token = self._pages.paginate(
            request.page_token, request.page_size, {"fleet": fleet},
            lambda after, limit: self._policies.runs(
                fleet, (int(after[0]), str(after[1])) if after else None, limit),
            lambda run: [run.start_us, run.id])
        return pb.ListPolicyRunsResponse(runs=[policy_run_pb(r) for r in runs],
                                         next_page_token=token)


def add_to_server(servicer: CompactorServicer, server: grpc.Server) -> None:
    pb_grpc.add_CompactorServiceServicer_to_server(servicer, server)
