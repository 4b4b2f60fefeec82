"""The compactor's use cases: the tiered iteration log (seed 003) and memory policy runs.

Recording an iteration is one database transaction (warm line chained to the
head, hot-ring entry, and the bookkeeping of any seal or snapshot it makes
due); that commit is the acknowledgement. Concurrent records share the
transaction (group commit), so they share its fsync. The blob work that follows (seal a
full segment, write the index file, write a cold snapshot, retire old
snapshots) is a sequence of idempotent steps whose outputs are pure functions
of content, so a crash at any step is repaired by running the sequence again:
on the next append to the run, and for every run by the repair loop from start-up on
(:meth:`IterationLog.recover`). A run whose tier work keeps failing is logged, recorded
(VerifyRun shows it, a metric counts it) and retried with backoff; it never blocks the others.

``hook(step)`` is called at each named step (:data:`~services.compactor.tiers.steps.STEPS`);
tests make it raise to simulate a crash exactly there.

Memory policies: the shard owns memory records, so :class:`MemoryPolicyRunner` asks it
through :class:`MemoryCompactionPort` and records every run; a failed call is recorded too,
then raised.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from services.common.blobstore import BlobStore
from services.common.commitment import is_salt, new_salt
from services.common.erasure_source import is_erasure_id
from services.common.errors import (
    Aborted,
    AlreadyExists,
    EngramError,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
)
from services.common.group_commit import GroupCommit
from services.common.limits import check_limit, check_policy_days, validate_request_id
from services.common.metrics import Tally
from services.common.settings import LIMIT_DEFAULTS, LimitsSettings
from services.common.storage_errors import outcome_known
from services.common.tokens import validate_identifier
from services.compactor.domain.blob_layout import SegmentEntry, SnapshotContent
from services.compactor.domain.memory_policy import (
    DEFAULT_IMPORTANCE_BELOW,
    DEFAULT_OLDER_THAN_DAYS,
    KIND_COMPACT,
    KIND_RETENTION,
    CompactionOutcome,
    PolicyRun,
)
from services.compactor.domain.model import (
    AppendOutcome,
    AppendPlan,
    AppendRequest,
    DetailSource,
    Pin,
    Reconstruction,
    RunHead,
    RunView,
    SnapshotInfo,
    SnapshotState,
    TierConfig,
    VerifyReport,
    plan_append,
)
from services.compactor.domain.repairs import RepairBackoff
from services.compactor.domain.warm_chain import (
    LINE_FORMAT,
    ChainWalker,
    IterationInput,
    WarmLine,
    detail_commitment,
    genesis_hash,
)
from services.compactor.repository import CompactorRepository, ConcurrentAppend
from services.compactor.tiers.cold import ColdArchive, SnapshotFacts
from services.compactor.tiers.steps import StepHook, StoredBlob, no_step_hook
from services.compactor.tiers.warm import WarmArchive

log = logging.getLogger("engram.compactor")

_APPEND_ATTEMPTS = 5
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REREAD_ATTEMPTS = 3  # a read whose chosen snapshot a retirement deleted: tries
MAX_TRAIL = 10_000
"""The most warm lines one reconstruction carries after its base snapshot (~12 MB at most)."""
_CACHED_SEGMENTS = 8
_FINISH_LOCKS = 64


@dataclass(frozen=True)
class ImportedIteration:
    """An iteration as its origin holds it: its warm line (with hashes), and its detail when
    the origin still keeps it (hot ring or cold snapshot); empty when only the line survived."""

    line: WarmLine
    detail_json: str = ""
    guardrails_json: str = ""


@dataclass(frozen=True)
class RecordResult:
    line: WarmLine
    created: bool


class IterationLog:
    """Records, reads, pins and verifies iteration logs across the hot, warm and cold tiers."""

    def __init__(self, repository: CompactorRepository, blobs: BlobStore,
                 config: TierConfig | None = None, hook: StepHook = no_step_hook,
                 repairs: RepairBackoff | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 limits: LimitsSettings = LIMIT_DEFAULTS) -> None:
        self.repo = repository
        self.limits = limits
        self.repairs = repairs or RepairBackoff(1.0, 300.0)
        self._clock = clock
        self.config = config or TierConfig()
        if self.config.hot_size < 1 or self.config.snapshot_every < 1:
            raise ValueError("hot_size and snapshot_every must be >= 1")
        self._hook = hook
        self._warm = WarmArchive(blobs, hook)
        self._cold = ColdArchive(blobs, hook)
        # Concurrent records share one transaction and one fsync.
        self._appends: GroupCommit[AppendRequest, AppendOutcome] = GroupCommit(
            self._append_group, alone_after=outcome_known)
        self._finish_locks = [threading.Lock() for _ in range(_FINISH_LOCKS)]
        self._segments: OrderedDict[str, list[WarmLine]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.sealed = Tally()
        """Warm-log segments sealed (segments) and their bytes (bytes)."""
        self.integrity_failures = Tally()
        """Problems found by VerifyRun in the warm and cold tiers."""

    # -- recording ------------------------------------------------------------

    def record(self, fleet_id: str, run_id: str, item: IterationInput,
               request_id: str = "") -> RecordResult:
        """Append ``item``; a retry with the same ``request_id`` returns what the first recorded."""
        item = item.validated(self.limits)
        if request_id:
            validate_request_id(request_id)
        salt = new_salt()  # a format-2 line (docs/erasure.md)
        request = AppendRequest(fleet_id, run_id, item,
                                detail_commitment(salt, item.detail_json, item.guardrails_json),
                                request_id, salt=salt)
        outcome = self._submit(request)
        if outcome.plan is None:
            return self._existing(fleet_id, run_id, item, outcome.recorded_iteration,
                                  request_id)
        return RecordResult(outcome.plan.line, True)

    def _submit(self, request: AppendRequest) -> AppendOutcome:
        """``request`` committed (``plan`` set) or found already recorded (``plan`` None),
        after the run's pending tier work is done; raised when it was refused."""
        for _attempt in range(_APPEND_ATTEMPTS):
            try:
                outcome = self._appends.submit(request)
            except ConcurrentAppend:
                continue
            if outcome.error is not None:
                raise outcome.error
            if outcome.retry:
                continue
            if outcome.head_pending or (outcome.plan is not None and outcome.plan.pending_work):
                self._finish_after_commit(request.fleet_id, request.run_id)
            return outcome
        raise Aborted(f"run {request.run_id} is being appended to concurrently and this "
                      f"iteration lost {_APPEND_ATTEMPTS} times; nothing was recorded, retry",
                      reason="CONCURRENT_APPEND")

    def import_iterations(self, fleet_id: str, run_id: str,
                          items: Sequence[ImportedIteration]) -> tuple[int, int]:
        """Iterations recorded at another instance, in order, each kept as it was there (its
        line must hash as it did); returns (created, already present). Each is committed as
        it is recorded: a call cut short is completed by sending it again."""
        if not items:
            raise InvalidArgument("an import call carries at least one iteration",
                                  reason="EMPTY_BATCH")
        check_limit("iterations in one import call", len(items), self.limits.batch_items,
                    "ENGRAM_LIMITS_BATCH_ITEMS", reason="BATCH_TOO_LARGE")
        checked = [self._checked_import(fleet_id, run_id, item) for item in items]
        created = 0
        for request in checked:
            outcome = self._submit(request)
            if outcome.plan is not None:
                created += 1
                continue
            stored = self.summary(fleet_id, run_id, request.item.iteration)
            if stored.hash != request.expected_hash:
                raise AlreadyExists(
                    f"iteration {request.item.iteration} of run {run_id} is already recorded "
                    "here with other content; the warm log is append-only",
                    reason="ITERATION_EXISTS",
                    metadata={"iteration": str(request.item.iteration)})
        return created, len(checked) - created

    def _checked_import(self, fleet_id: str, run_id: str,
                        imported: ImportedIteration) -> AppendRequest:
        line = imported.line
        if line.iteration < 1:
            raise InvalidArgument(f"an imported iteration is >= 1, got {line.iteration}")
        if line.erased:
            return self._checked_tombstone(fleet_id, run_id, imported)
        if line.format not in (1, LINE_FORMAT) or (
                line.format == 1 and (line.salt or line.summary_commitment)):
            raise InvalidArgument(
                f"iteration {line.iteration}: format {line.format} is not a warm line format "
                "(1 without salt and commitment, or 2 with them)", reason="INVALID_FORMAT",
                metadata={"iteration": str(line.iteration)})
        hashes = ("detail_digest", "hash", "summary_commitment")
        _require_sha256(line, hashes if line.format == LINE_FORMAT else hashes[:2])
        if line.format == LINE_FORMAT and not is_salt(line.salt):
            raise InvalidArgument(f"iteration {line.iteration}: a format-2 line's salt is 64 "
                                  "lowercase hex characters", reason="INVALID_SALT",
                                  metadata={"iteration": str(line.iteration)})
        if not line.intact():  # its summaryCommitment too, not only what the hash re-derives
            raise InvalidArgument(
                f"iteration {line.iteration}: its summary does not hash to its hash or its "
                "commitment (altered)", reason="ITERATION_HASH_MISMATCH",
                metadata={"iteration": str(line.iteration)})
        known = bool(imported.detail_json or imported.guardrails_json)
        item = IterationInput(
            iteration=line.iteration, plan_digest=line.plan_digest,
            parent_digest=line.parent_digest, start_ts=line.start_ts, end_ts=line.end_ts,
            files_touched=line.files_touched, net_add=line.net_add, net_del=line.net_del,
            risk_score=line.risk_score, status=line.status,
            detail_json=imported.detail_json or "null",
            guardrails_json=imported.guardrails_json or "null").validated(self.limits)
        if known and not line.commits_detail(item.detail_json, item.guardrails_json):
            raise InvalidArgument(
                f"iteration {line.iteration}: its detail does not hash (format 1) or commit "
                "(format 2, under its salt) to its summary's detail_digest (altered)",
                reason="DETAIL_DIGEST_MISMATCH", metadata={"iteration": str(line.iteration)})
        return AppendRequest(fleet_id, run_id, item, line.detail_digest, detail_known=known,
                             expected_hash=line.hash, salt=line.salt)

    def _checked_tombstone(self, fleet_id: str, run_id: str,
                           imported: ImportedIteration) -> AppendRequest:
        """An iteration erased in place at the origin: kept as its tombstone, no detail."""
        line = imported.line
        where = {"iteration": str(line.iteration)}
        if line.format != LINE_FORMAT:
            raise InvalidArgument(f"iteration {line.iteration}: a tombstone is format 2",
                                  reason="INVALID_FORMAT", metadata=where)
        _require_sha256(line, ("detail_digest", "hash", "summary_commitment", "prev_hash"),
                        where)
        if imported.detail_json or imported.guardrails_json:
            raise InvalidArgument(f"iteration {line.iteration} is a tombstone: it carries no "
                                  "detail", reason="TOMBSTONE_WITH_DETAIL", metadata=where)
        check_tombstone_form(line)
        if not line.intact():
            raise InvalidArgument(
                f"iteration {line.iteration}: its tombstone does not hash to its hash, or names "
                "no erasure id (era_ and 28 hex digits) or erase time (altered)",
                reason="ITERATION_HASH_MISMATCH", metadata=where)
        item = IterationInput(iteration=line.iteration, plan_digest="", parent_digest="",
                              start_ts="", end_ts="", files_touched=0, net_add=0, net_del=0,
                              risk_score=0.0, status="erased", detail_json="null",
                              guardrails_json="null")
        return AppendRequest(fleet_id, run_id, item, line.detail_digest, detail_known=False,
                             expected_hash=line.hash, tombstone=line)

    def _finish_after_commit(self, fleet_id: str, run_id: str) -> None:
        """The iteration is committed: a failed seal or snapshot is not a failed write."""
        if self.repairs.due((fleet_id, run_id), self._clock()):
            self.repair(fleet_id, run_id)

    def _append_group(self, requests: Sequence[AppendRequest]) -> list[AppendOutcome]:
        return self.repo.append_group(requests, self._plan)

    def _existing(self, fleet_id: str, run_id: str, item: IterationInput,
                  recorded_iteration: int, request_id: str) -> RecordResult:
        if recorded_iteration:
            line = self.summary(fleet_id, run_id, recorded_iteration)
            if item.iteration in (0, recorded_iteration) and line.same_content(item):
                return RecordResult(line, False)
            if line.erased:
                raise _erased(run_id, line)
            raise AlreadyExists(
                f"request_id {request_id!r} already recorded iteration {recorded_iteration} of "
                f"run {run_id} with other content; use a new request_id for a new iteration",
                reason="REQUEST_ID_REUSED", metadata={"iteration": str(recorded_iteration)})
        line = self.summary(fleet_id, run_id, item.iteration)
        if line.same_content(item):
            return RecordResult(line, False)
        if line.erased:
            raise _erased(run_id, line)
        raise AlreadyExists(
            f"iteration {item.iteration} of run {run_id} is already recorded with different "
            "content; the warm log is append-only", reason="ITERATION_EXISTS",
            metadata={"iteration": str(item.iteration)})

    def _plan(self, request: AppendRequest, head: RunHead | None) -> AppendPlan | None:
        return plan_append(self.config, request, head)

    # -- the post-commit steps ------------------------------------------------

    def recover(self) -> int:
        """Finish interrupted seals, snapshots and retention for every run not waiting out a
        backoff; return how many runs were finished (a failing one is recorded, not raised)."""
        now = self._clock()
        due = [key for key in self.repo.runs_with_pending_work() if self.repairs.due(key, now)]
        return sum(self.repair(fleet_id, run_id) for fleet_id, run_id in due)

    def repair(self, fleet_id: str, run_id: str) -> bool:
        """Finish the run's pending tier work; on failure log it, record it for a retry after
        a backoff, and return False (the run keeps ``pending_work``)."""
        key = (fleet_id, run_id)
        try:
            self.finish_pending(fleet_id, run_id)
        except Exception as error:
            failure = self.repairs.failed(key, _describe(error), self._clock())
            log.warning("tier work failed; retrying after a backoff", exc_info=True,
                        extra={"fleet_id": fleet_id, "run_id": run_id,
                               "attempts": failure.attempts, "error": failure.error,
                               "retry_in_s": round(failure.retry_at - self._clock(), 3)})
            return False
        if self.repairs.succeeded(key):
            log.info("tier work repaired", extra={"fleet_id": fleet_id, "run_id": run_id})
        return True

    def finish_pending(self, fleet_id: str, run_id: str) -> None:
        # One finisher per run at a time: two would race on the same puts and index version.
        with self.run_lock(fleet_id, run_id):
            self._finish_pending(fleet_id, run_id)

    def run_lock(self, fleet_id: str, run_id: str) -> threading.Lock:
        """Held by whoever writes the run's blobs (its finisher, its eraser)."""
        return self._finish_locks[hash((fleet_id, run_id)) % len(self._finish_locks)]

    @property
    def warm(self) -> WarmArchive:
        """The sealed segments' archive (an erasure in place rewrites a segment through it)."""
        return self._warm

    def drop_cached(self, prefix: str) -> None:
        """Forget cached segments whose keys start with ``prefix`` (an erased run's)."""
        with self._cache_lock:
            for key in [k for k in self._segments if k.startswith(prefix)]:
                del self._segments[key]

    def _finish_pending(self, fleet_id: str, run_id: str) -> None:
        for snapshot in self.repo.snapshots(fleet_id, run_id, SnapshotState.PENDING):
            self._store_snapshot(fleet_id, run_id, snapshot)
        for seq in self.repo.sealing_segments(fleet_id, run_id):
            self._seal(fleet_id, run_id, seq)
        self._retire_snapshots(fleet_id, run_id)
        self.repo.clear_pending(fleet_id, run_id)

    def _store_snapshot(self, fleet_id: str, run_id: str, snapshot: SnapshotInfo) -> None:
        hot = self.repo.hot(fleet_id, run_id, snapshot.iteration)
        if hot is None:
            raise IntegrityError(
                f"snapshot of iteration {snapshot.iteration} of run {run_id} is pending but its "
                "detail left the hot ring", reason="SNAPSHOT_DETAIL_MISSING")
        sha, size = self._cold.write(fleet_id, run_id, snapshot, hot)
        self.repo.mark_snapshot_stored(fleet_id, run_id, snapshot.iteration, sha, size)

    def _seal(self, fleet_id: str, run_id: str, seq: int) -> None:
        lines = self.repo.segment_lines(fleet_id, run_id, seq)
        if not lines:
            raise IntegrityError(f"segment {seq} of run {run_id} has no lines to seal")
        entry = self._warm.write_segment(fleet_id, run_id, seq, lines)
        head = self.repo.head(fleet_id, run_id)
        version = (head.index_version if head else 0) + 1
        # An index file of a version not committed yet was left by a crash (a seal's, or an
        # erasure's rewrite whose commit never came, listing other segments): not ours to keep.
        self._warm.discard_index(fleet_id, run_id, version)
        self._warm.write_index(fleet_id, run_id, version,
                               [*self.repo.sealed_segments(fleet_id, run_id), entry])
        self.repo.complete_seal(fleet_id, run_id, entry, version)
        self.sealed.add("segments")
        self.sealed.add("bytes", amount=entry.bytes)
        self._hook("seal:after_commit")
        self._warm.drop_indexes_before(fleet_id, run_id, version)

    def _retire_snapshots(self, fleet_id: str, run_id: str) -> None:
        retiring = self.repo.mark_retiring(fleet_id, run_id, self.config.keep_snapshots)
        self._cold.delete(retiring)
        if retiring:
            self.repo.drop_snapshots(fleet_id, run_id, [s.iteration for s in retiring])

    # -- reading --------------------------------------------------------------

    def _head(self, fleet_id: str, run_id: str) -> RunHead:
        head = self.repo.head(fleet_id, run_id)
        if head is None:
            raise _run_not_found(fleet_id, run_id)
        return head

    def last_iteration(self, fleet_id: str, run_id: str) -> int:
        return self._head(fleet_id, run_id).last_iter

    def _segment(self, entry: SegmentEntry) -> list[WarmLine]:
        with self._cache_lock:
            cached = self._segments.get(entry.key)
            if cached is not None:
                self._segments.move_to_end(entry.key)
                return cached
        lines = self._warm.read_segment(entry)
        with self._cache_lock:
            self._segments[entry.key] = lines
            while len(self._segments) > _CACHED_SEGMENTS:
                self._segments.popitem(last=False)
        return lines

    def summaries(self, fleet_id: str, run_id: str, first: int, last: int) -> list[WarmLine]:
        """Warm lines ``first..last`` across sealed segments and the database. A segment file
        gone between the listing and its read (an erasure in place rewrote it under a new key)
        is read again from a new listing."""
        for attempt in range(_REREAD_ATTEMPTS):
            found: list[WarmLine] = []
            sealed, in_database = self.repo.warm_lines(fleet_id, run_id, first, last)
            try:
                for entry in sealed:
                    if entry.last_iter < first or entry.first_iter > last:
                        continue
                    found.extend(x for x in self._segment(entry)
                                 if first <= x.iteration <= last)
            except NotFound:
                if attempt == _REREAD_ATTEMPTS - 1:
                    raise
                continue
            found.extend(in_database)
            return found
        raise AssertionError("unreachable")

    def summary(self, fleet_id: str, run_id: str, iteration: int) -> WarmLine:
        head = self._head(fleet_id, run_id)
        if not 1 <= iteration <= head.last_iter:
            raise NotFound(f"run {run_id} has iterations 1..{head.last_iter}, not {iteration}",
                           reason="ITERATION_NOT_FOUND")
        lines = self.summaries(fleet_id, run_id, iteration, iteration)
        if len(lines) != 1:
            self._head(fleet_id, run_id)  # erased meanwhile (ForgetIterations): NOT_FOUND
            raise IntegrityError(f"iteration {iteration} of run {run_id} is missing from the "
                                 "warm log", reason="WARM_LINE_MISSING")
        return lines[0]

    def recent(self, fleet_id: str, run_id: str, below: int | None,
               limit: int) -> list[tuple[WarmLine, str, str]]:
        self._head(fleet_id, run_id)
        return [(e.line, e.detail_json, e.guardrails_json)
                for e in self.repo.recent(fleet_id, run_id, below, limit)]

    def reconstruct(self, fleet_id: str, run_id: str, iteration: int) -> Reconstruction:
        line = self.summary(fleet_id, run_id, iteration)
        if line.erased:  # its detail, hot entry and cold snapshot went with it
            return Reconstruction(line, DetailSource.SUMMARY_ONLY)
        hot = self.repo.hot(fleet_id, run_id, iteration)
        if hot is not None:
            self._check_detail(line, hot.detail_json, hot.guardrails_json, "hot ring")
            return Reconstruction(line, DetailSource.HOT, hot.detail_json, hot.guardrails_json,
                                  iteration)
        based = self._cold_base(fleet_id, run_id, iteration)
        if based is None:
            return Reconstruction(line, DetailSource.SUMMARY_ONLY)
        base, content = based
        if base.iteration == iteration:
            self._check_detail(line, content.detail_json, content.guardrails_json, base.key)
            return Reconstruction(line, DetailSource.COLD_SNAPSHOT, content.detail_json,
                                  content.guardrails_json, iteration)
        if iteration - base.iteration > MAX_TRAIL:
            # Pins keep a snapshot for good, so the nearest one before may be any distance
            # back: every line between was read and held, past gRPC's reply limit near 58,000
            # (found by review on 2026-11-30).
            raise FailedPrecondition(
                f"iteration {iteration} is {iteration - base.iteration} iterations after the "
                f"nearest stored snapshot ({base.iteration}), over the {MAX_TRAIL} lines one "
                f"reconstruction carries: read the trail with ListSummaries from "
                f"{base.iteration + 1}", reason="TRAIL_TOO_LONG",
                metadata={"base_iteration": str(base.iteration), "limit": str(MAX_TRAIL)})
        trail = self.summaries(fleet_id, run_id, base.iteration, iteration)
        if trail[0].hash != content.summary.hash or trail[0].iteration != base.iteration:
            raise IntegrityError(f"snapshot {base.key} does not match the warm log",
                                 reason="SNAPSHOT_MISMATCH")
        self._check_detail(trail[0], content.detail_json, content.guardrails_json, base.key)
        return Reconstruction(line, DetailSource.BASE_SNAPSHOT, content.detail_json,
                              content.guardrails_json, base.iteration, tuple(trail[1:]))

    def _cold_base(self, fleet_id: str, run_id: str,
                   iteration: int) -> tuple[SnapshotInfo, SnapshotContent] | None:
        """The newest stored snapshot at or before ``iteration``, read. One retired (and its
        file deleted) between the choice and the read is not missing: choose again."""
        for _ in range(_REREAD_ATTEMPTS):
            base = self.repo.stored_snapshot_at_or_before(fleet_id, run_id, iteration)
            if base is None:
                return None
            try:
                return base, self._cold.read(base)
            except NotFound:
                if self.repo.stored_snapshot_at_or_before(fleet_id, run_id, iteration) == base:
                    raise  # still the stored one: its file is really missing
        raise Aborted(f"the snapshots of run {run_id} were retired {_REREAD_ATTEMPTS} times "
                      "while this read chose one; retry", reason="SNAPSHOT_RETIRED")

    @staticmethod
    def _check_detail(line: WarmLine, detail: str, guardrails: str, where: str) -> None:
        if not line.commits_detail(detail, guardrails):
            raise IntegrityError(f"detail of iteration {line.iteration} in {where} does not "
                                 "match the warm line's detailDigest", reason="DETAIL_TAMPERED")

    # -- pins and verification ----------------------------------------------------

    def pin(self, fleet_id: str, run_id: str, iteration: int, reason: str) -> Pin:
        if not reason.strip() or len(reason) > 2000:
            raise InvalidArgument("a pin needs a reason of 1..2000 characters")
        self.summary(fleet_id, run_id, iteration)
        pin = self.repo.add_pin(fleet_id, run_id, iteration, reason.strip())
        self.finish_pending(fleet_id, run_id)
        return pin

    def verify(self, fleet_id: str, run_id: str) -> VerifyReport:
        """Check the run's warm log, index, and stored snapshots against its head, all as read
        at one moment.

        A seal deletes the index file it supersedes and a retirement its snapshot's file, both
        under the run's lock: the view and the index file it names are read holding that lock,
        so the file is there unless it is really missing. Snapshot files are read after the
        lock is released, and one found missing is checked against the run's stored snapshots
        under the lock again (retired meanwhile is not damage). Segment files are not deleted
        by either; they are read and every check made after the lock is released (an erasure
        deleting them meanwhile is NOT_FOUND, not damage), except by an erasure in place,
        which rewrites a segment holding an erased line under a new key with a new index
        version: a report with problems whose run changed its index version meanwhile is made
        again."""
        for _attempt in range(_REREAD_ATTEMPTS):
            view, report = self._verify_once(fleet_id, run_id)
            if report.ok:
                break
            now = self._head(fleet_id, run_id)  # erased meanwhile (ForgetIterations): NOT_FOUND
            if now.index_version == view.head.index_version:
                break
        self.integrity_failures.add("WARM_LOG_PROBLEM", amount=len(report.problems))
        return report

    def _verify_once(self, fleet_id: str, run_id: str) -> tuple[RunView, VerifyReport]:
        with self.run_lock(fleet_id, run_id):
            view = self._view(fleet_id, run_id)
            index = self._warm.load_index(fleet_id, run_id, view.head.index_version,
                                          view.sealed)
        # The snapshot files are read without the lock (64 runs share it, and a run may hold
        # a thousand pinned snapshots): one found missing is damage only if the run still
        # lists it as stored once the lock is held again (not retired or erased meanwhile).
        snapshots = self._cold.load(view.snapshots)
        missing = [s for s in view.snapshots if snapshots[s.iteration].missing]
        if missing:
            with self.run_lock(fleet_id, run_id):
                now = self.repo.view(fleet_id, run_id)
            stored = {s.iteration: s for s in now.snapshots} if now is not None else {}
            gone = {s.iteration for s in missing if stored.get(s.iteration) != s}
            view = replace(view, snapshots=[s for s in view.snapshots
                                            if s.iteration not in gone])
        return view, self._verify_view(view, index, snapshots)

    def _view(self, fleet_id: str, run_id: str) -> RunView:
        view = self.repo.view(fleet_id, run_id)
        if view is None:
            raise _run_not_found(fleet_id, run_id)
        return view

    def _verify_view(self, view: RunView, index: StoredBlob | None,
                     snapshots: Mapping[int, SnapshotFacts]) -> VerifyReport:
        head, sealed = view.head, view.sealed
        fleet_id, run_id = head.fleet_id, head.run_id
        walker = ChainWalker(genesis_hash(fleet_id, run_id))
        problems = self._warm.check_index(index, sealed)
        segment_problems, hashes = self._warm.check_segments(sealed, walker)
        problems.extend(segment_problems)
        for iteration, text in view.line_texts:
            line = walker.feed_text(f"active line {iteration}", text)
            if line is not None:
                hashes[line.iteration] = line.hash
        problems.extend((p.location, p.detail) for p in walker.problems)
        if walker.expected_iter - 1 != head.last_iter or walker.expected_prev != head.head_hash:
            problems.append(("head", f"the run's head is iteration {head.last_iter}; the warm "
                                     f"log ends at {walker.expected_iter - 1} with another hash"))
        problems.extend(self._cold.check(view.snapshots, snapshots, hashes))
        failure = self.repairs.failure((fleet_id, run_id))
        if failure is not None:
            problems.append(("tier work", f"pending seals or snapshots failed {failure.attempts} "
                                          f"time(s), last: {failure.error}; retried with backoff"))
        return VerifyReport(walker.checked, len(sealed), len(view.snapshots), head.last_iter,
                            head.head_hash, tuple(problems), tuple(walker.tombstones))

    def index_entries(self, fleet_id: str, run_id: str) -> list[SegmentEntry]:
        """The newest index file's segment list (what operators and tools read)."""
        with self.run_lock(fleet_id, run_id):  # no seal replaces it between the two reads
            head = self._head(fleet_id, run_id)
            if head.index_version == 0:
                return []
            return self._warm.read_index(fleet_id, run_id, head.index_version)


class MemoryCompactionPort(Protocol):
    def compact(self, fleet_id: str, importance_below: float, older_than_days: float,
                dry_run: bool) -> CompactionOutcome:
        """Raises ``Unavailable`` when the shard cannot be reached."""

    def apply_retention(self, fleet_id: str, older_than_days: float,
                        dry_run: bool) -> Sequence[str]:
        """The removed (or, in a dry run, removable) record ids."""


def _require_sha256(line: WarmLine, names: Sequence[str],
                    metadata: Mapping[str, str] | None = None) -> None:
    """INVALID_ARGUMENT INVALID_HASH unless each of the line's ``names`` is a SHA-256."""
    for name in names:
        if not _SHA256.fullmatch(getattr(line, name)):
            raise InvalidArgument(f"iteration {line.iteration}: {name} must be a SHA-256 "
                                  "(64 lowercase hex characters)", reason="INVALID_HASH",
                                  metadata=metadata)


def _erased(run_id: str, line: WarmLine) -> AlreadyExists:
    """A call for an iteration erased in place (a retry of the call that recorded it, or the
    same iteration again): it is not recorded again."""
    return AlreadyExists(
        f"iteration {line.iteration} of run {run_id} was erased (erasure {line.erasure_id}); "
        "the warm log is append-only and an erased iteration is not recorded again",
        reason="ITERATION_ERASED", metadata={"iteration": str(line.iteration)})


def check_tombstone_form(line: WarmLine) -> None:
    """INVALID_ARGUMENT INVALID_TOMBSTONE unless an imported line's erasure fields are those
    of a tombstone (an erasure id of governance's form, an erase time, the eraser's id) or
    all absent (a line that was not erased)."""
    where = {"iteration": str(line.iteration)}
    if not line.erased:
        if line.erased_us or line.erased_by:
            raise InvalidArgument(f"iteration {line.iteration} carries a tombstone's erase time "
                                  "or eraser but no erasure_id", reason="INVALID_TOMBSTONE",
                                  metadata=where)
        return
    if not is_erasure_id(line.erasure_id) or line.erased_us <= 0:
        raise InvalidArgument(f"iteration {line.iteration} is a tombstone: it names the erasure "
                              "that erased it (era_ and 28 lowercase hex digits) and when",
                              reason="INVALID_TOMBSTONE", metadata=where)
    validate_identifier("erased_by", line.erased_by)


def _run_not_found(fleet_id: str, run_id: str) -> NotFound:
    return NotFound(f"run {run_id} has no recorded iterations in fleet {fleet_id}",
                    reason="RUN_NOT_FOUND")


def _describe(error: Exception) -> str:
    if isinstance(error, EngramError):
        return f"{error.code}: {error.message}"
    return f"{type(error).__name__}: {error}"


def _now_us() -> int:
    return time.time_ns() // 1000


class MemoryPolicyRunner:
    """Runs memory compaction and retention on the shard and records every run."""

    def __init__(self, port: MemoryCompactionPort, repository: CompactorRepository) -> None:
        self._port = port
        self._repo = repository
        self.runs_done = Tally()
        """Policy runs by kind (compact, retention) and outcome (succeeded, failed)."""
        self.records = Tally()
        """Records compacted into summaries (compacted) or removed by retention (removed)."""

    def _save(self, run: PolicyRun) -> None:
        self._repo.save_policy_run(run)
        self.runs_done.add(run.kind, run.outcome)
        if not run.dry_run:
            self.records.add("compacted", amount=run.compacted)
            self.records.add("removed", amount=len(run.removed_ids))

    def compact(self, fleet_id: str, trigger: str, *, dry_run: bool,
                importance_below: float | None = None,
                older_than_days: float | None = None) -> PolicyRun:
        below = DEFAULT_IMPORTANCE_BELOW if importance_below is None else importance_below
        days = DEFAULT_OLDER_THAN_DAYS if older_than_days is None else older_than_days
        if not 0.0 < below <= 1.0:
            raise InvalidArgument(f"importance_below must be in (0, 1], got {below}")
        check_policy_days(days, retention=False)
        start = _now_us()
        try:
            outcome = self._port.compact(fleet_id, below, days, dry_run)
        except EngramError as error:
            self._save(self._failed(KIND_COMPACT, fleet_id, trigger, dry_run,
                                                    below, days, start, error))
            raise
        run = PolicyRun(
            id=uuid.uuid4().hex, fleet_id=fleet_id, kind=KIND_COMPACT, dry_run=dry_run,
            trigger=trigger, outcome="succeeded", error="", examined=outcome.examined,
            compacted=outcome.compacted, groups=outcome.groups, removed_ids=(),
            importance_below=below, older_than_days=days, start_us=start, end_us=_now_us(),
        )
        self._save(run)
        return run

    def apply_retention(self, fleet_id: str, trigger: str, *, older_than_days: float,
                        dry_run: bool) -> PolicyRun:
        check_policy_days(older_than_days, retention=True)
        start = _now_us()
        try:
            removed = tuple(self._port.apply_retention(fleet_id, older_than_days, dry_run))
        except EngramError as error:
            self._save(self._failed(KIND_RETENTION, fleet_id, trigger, dry_run,
                                                    0.0, older_than_days, start, error))
            raise
        run = PolicyRun(
            id=uuid.uuid4().hex, fleet_id=fleet_id, kind=KIND_RETENTION, dry_run=dry_run,
            trigger=trigger, outcome="succeeded", error="", examined=len(removed), compacted=0,
            groups=(), removed_ids=removed, importance_below=0.0,
            older_than_days=older_than_days, start_us=start, end_us=_now_us(),
        )
        self._save(run)
        return run

    def runs(self, fleet_id: str, after: tuple[int, str] | None, limit: int) -> list[PolicyRun]:
        """The fleet's recorded runs, newest first; ``after`` continues after a page."""
        return self._repo.policy_runs(fleet_id, after, limit)

    @staticmethod
    def _failed(kind: str, fleet_id: str, trigger: str, dry_run: bool, below: float,
                days: float, start: int, error: EngramError) -> PolicyRun:
        return PolicyRun(
            id=uuid.uuid4().hex, fleet_id=fleet_id, kind=kind, dry_run=dry_run, trigger=trigger,
            outcome="failed", error=f"{error.code}: {error.message}", examined=0, compacted=0,
            groups=(), removed_ids=(), importance_below=below, older_than_days=days,
            start_us=start, end_us=_now_us(),
        )
