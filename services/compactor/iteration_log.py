"""IterationLog: the three tiers of seed 003 over the compactor's store and a blob store.

Recording an iteration is one database transaction (warm line chained to the
head, hot-ring entry, and the bookkeeping of any seal or snapshot it makes
due); that commit is the acknowledgement. Concurrent records share the
transaction (group commit), so they share its fsync. The blob work that follows (seal a
full segment, write the index file, write a cold snapshot, retire old
snapshots) is a sequence of idempotent steps whose outputs are pure functions
of content, so a crash at any step is repaired by running the sequence again:
on the next append to the run, and for every run at start-up (:meth:`recover`).

``hook(step)`` is called at each named step (:data:`STEPS`); tests make it
raise to simulate a crash exactly there.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from services.common.blobstore import BlobStore
from services.common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
)
from services.common.group_commit import GroupCommit
from services.compactor.archive import (
    SegmentEntry,
    SnapshotContent,
    digest_of,
    gzip_chunks,
    index_document,
    index_key,
    parse_index,
    parse_segment,
    read_snapshot,
    run_prefix,
    segment_bytes,
    segment_key,
    snapshot_payload,
)
from services.compactor.model import (
    AppendOutcome,
    AppendPlan,
    AppendRequest,
    DetailSource,
    Pin,
    Reconstruction,
    RunHead,
    SnapshotInfo,
    SnapshotState,
    TierConfig,
    VerifyReport,
)
from services.compactor.repository import ConcurrentAppend, IterationRepository
from services.compactor.warm_chain import (
    ChainWalker,
    IterationInput,
    WarmLine,
    canonical_detail_digest,
    detail_digest,
    genesis_hash,
)

log = logging.getLogger("engram.compactor")

StepHook = Callable[[str], None]
STEPS = (
    "seal:before_rename", "seal:after_rename", "seal:after_index", "seal:after_commit",
    "snapshot:mid_gzip", "snapshot:before_rename", "snapshot:after_rename",
    "retention:mid",
)
_APPEND_ATTEMPTS = 5
_MAX_REQUEST_ID = 128
_CACHED_SEGMENTS = 8
_FINISH_LOCKS = 64


def _no_hook(_step: str) -> None:
    return None


@dataclass(frozen=True)
class RecordResult:
    line: WarmLine
    created: bool


class IterationLog:
    def __init__(self, repository: IterationRepository, blobs: BlobStore,
                 config: TierConfig | None = None, hook: StepHook = _no_hook) -> None:
        self.repo = repository
        self.blobs = blobs
        self.config = config or TierConfig()
        if self.config.hot_size < 1 or self.config.snapshot_every < 1:
            raise ValueError("hot_size and snapshot_every must be >= 1")
        self.hook = hook
        # Concurrent records share one transaction and one fsync.
        self._appends: GroupCommit[AppendRequest, AppendOutcome] = GroupCommit(
            self._append_group)
        self._finish_locks = [threading.Lock() for _ in range(_FINISH_LOCKS)]
        self._segments: OrderedDict[str, list[WarmLine]] = OrderedDict()
        self._cache_lock = threading.Lock()

    # -- recording ------------------------------------------------------------

    def record(self, fleet_id: str, run_id: str, item: IterationInput,
               request_id: str = "") -> RecordResult:
        """Append ``item``; a retry with the same ``request_id`` returns what the first recorded."""
        item = item.validated()
        if len(request_id) > _MAX_REQUEST_ID:
            raise InvalidArgument(f"request_id must be at most {_MAX_REQUEST_ID} characters",
                                  reason="INVALID_REQUEST_ID")
        request = AppendRequest(fleet_id, run_id, item,
                                canonical_detail_digest(item.detail_json, item.guardrails_json),
                                request_id)
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
                self._finish_after_commit(fleet_id, run_id)
            if outcome.plan is None:
                return self._existing(fleet_id, run_id, item, outcome.recorded_iteration,
                                      request_id)
            return RecordResult(outcome.plan.line, True)
        raise Aborted(f"run {run_id} is being appended to concurrently and this iteration lost "
                      f"{_APPEND_ATTEMPTS} times; nothing was recorded, retry",
                      reason="CONCURRENT_APPEND")

    def _finish_after_commit(self, fleet_id: str, run_id: str) -> None:
        """The iteration is committed: a failed seal or snapshot is not a failed write."""
        try:
            self.finish_pending(fleet_id, run_id)
        except Exception:
            # the run keeps pending_work; the next append or recover() at start redoes the steps
            log.exception("tier work after a committed iteration failed; left for repair",
                          extra={"fleet_id": fleet_id, "run_id": run_id})

    def _append_group(self, requests: Sequence[AppendRequest]) -> list[AppendOutcome]:
        return self.repo.append_group(requests, self._plan)

    def _existing(self, fleet_id: str, run_id: str, item: IterationInput,
                  recorded_iteration: int, request_id: str) -> RecordResult:
        if recorded_iteration:
            line = self.summary(fleet_id, run_id, recorded_iteration)
            if item.iteration in (0, recorded_iteration) and line.same_content(item):
                return RecordResult(line, False)
            raise AlreadyExists(
                f"request_id {request_id!r} already recorded iteration {recorded_iteration} of "
                f"run {run_id} with other content; use a new request_id for a new iteration",
                reason="REQUEST_ID_REUSED", metadata={"iteration": str(recorded_iteration)})
        line = self.summary(fleet_id, run_id, item.iteration)
        if line.same_content(item):
            return RecordResult(line, False)
        raise AlreadyExists(
            f"iteration {item.iteration} of run {run_id} is already recorded with different "
            "content; the warm log is append-only", reason="ITERATION_EXISTS",
            metadata={"iteration": str(item.iteration)})

    def _plan(self, request: AppendRequest, head: RunHead | None) -> AppendPlan | None:
        """The append ``request`` makes on top of ``head``; ``None`` when already recorded."""
        fleet_id, run_id, item = request.fleet_id, request.run_id, request.item
        last = head.last_iter if head else 0
        iteration = item.iteration or last + 1
        if iteration <= last:
            return None
        if iteration != last + 1:
            raise FailedPrecondition(
                f"run {run_id} is at iteration {last}; the next one to record is {last + 1}, "
                f"not {iteration}", reason="ITERATION_OUT_OF_ORDER",
                metadata={"next_iteration": str(last + 1)})
        prev = head.head_hash if head else genesis_hash(fleet_id, run_id)
        line = WarmLine.chained(item, iteration, prev, request.detail_digest)
        size = len(line.text().encode()) + 1
        seq = head.active_seq if head else 1
        active = head.active_bytes if head else 0
        seal_seq = None
        if active > 0 and active + size > self.config.rotate_bytes:
            seal_seq, seq, active = seq, seq + 1, 0
        snapshot = iteration % self.config.snapshot_every == 0
        return AppendPlan(
            line=line, line_bytes=size, seq=seq, active_bytes=active + size, seal_seq=seal_seq,
            snapshot=snapshot, trim_through=iteration - self.config.hot_size,
            pending_work=bool(seal_seq is not None or snapshot or (head and head.pending_work)),
        )

    # -- the post-commit steps ------------------------------------------------

    def recover(self) -> int:
        """Finish interrupted seals, snapshots and retention for every run; return how many."""
        runs = self.repo.runs_with_pending_work()
        for fleet_id, run_id in runs:
            self.finish_pending(fleet_id, run_id)
        return len(runs)

    def finish_pending(self, fleet_id: str, run_id: str) -> None:
        # One finisher per run at a time: two would race on the same puts and index version.
        with self._finish_locks[hash((fleet_id, run_id)) % len(self._finish_locks)]:
            self._finish_pending(fleet_id, run_id)

    def _finish_pending(self, fleet_id: str, run_id: str) -> None:
        for snapshot in self.repo.snapshots(fleet_id, run_id, SnapshotState.PENDING):
            self._store_snapshot(fleet_id, run_id, snapshot)
        for seq in self.repo.sealing_segments(fleet_id, run_id):
            self._seal(fleet_id, run_id, seq)
        self._retire_snapshots(fleet_id, run_id)
        self.repo.clear_pending(fleet_id, run_id)

    def _put_once(self, key: str, data: bytes | Iterable[bytes], expected_sha: str) -> None:
        """Atomic put-if-absent; an existing blob must be the same bytes (a redone step)."""
        if self.blobs.exists(key):
            if digest_of(b"".join(self.blobs.open(key))) != expected_sha:
                raise IntegrityError(f"blob {key} exists with different content",
                                     reason="BLOB_CONFLICT")
            return
        chunks = [data] if isinstance(data, bytes) else data
        info = self.blobs.put(key, chunks)
        if info.sha256 != expected_sha:
            raise IntegrityError(f"blob {key} was stored with an unexpected digest")

    def _hooked(self, chunks: Iterable[bytes], mid: str | None, end: str) -> Iterator[bytes]:
        for number, chunk in enumerate(chunks):
            if number == 1 and mid:
                self.hook(mid)
            yield chunk
        self.hook(end)  # the adapter has every byte in its temp file, nothing renamed yet

    def _store_snapshot(self, fleet_id: str, run_id: str, snapshot: SnapshotInfo) -> None:
        hot = self.repo.hot(fleet_id, run_id, snapshot.iteration)
        if hot is None:
            raise IntegrityError(
                f"snapshot of iteration {snapshot.iteration} of run {run_id} is pending but its "
                "detail left the hot ring", reason="SNAPSHOT_DETAIL_MISSING")
        payload = snapshot_payload(fleet_id, run_id, hot.line, hot.detail_json,
                                   hot.guardrails_json)
        compressed = b"".join(gzip_chunks(payload))
        sha = digest_of(compressed)
        self._put_once(snapshot.key, self._hooked(gzip_chunks(payload), "snapshot:mid_gzip",
                                                  "snapshot:before_rename"), sha)
        self.hook("snapshot:after_rename")
        self.repo.mark_snapshot_stored(fleet_id, run_id, snapshot.iteration, sha,
                                       len(compressed))

    def _seal(self, fleet_id: str, run_id: str, seq: int) -> None:
        lines = self.repo.segment_lines(fleet_id, run_id, seq)
        if not lines:
            raise IntegrityError(f"segment {seq} of run {run_id} has no lines to seal")
        data = segment_bytes(lines)
        entry = SegmentEntry(
            seq=seq, key=segment_key(fleet_id, run_id, seq, lines[0].start_ts),
            first_iter=lines[0].iteration, last_iter=lines[-1].iteration, lines=len(lines),
            bytes=len(data), sha256=digest_of(data), first_prev_hash=lines[0].prev_hash,
            last_hash=lines[-1].hash)
        self._put_once(entry.key, self._hooked([data], None, "seal:before_rename"), entry.sha256)
        self.hook("seal:after_rename")
        head = self.repo.head(fleet_id, run_id)
        version = (head.index_version if head else 0) + 1
        sealed = [*self.repo.sealed_segments(fleet_id, run_id), entry]
        document = index_document(fleet_id, run_id, version, sealed)
        self._put_once(index_key(fleet_id, run_id, version), document, digest_of(document))
        self.hook("seal:after_index")
        self.repo.complete_seal(fleet_id, run_id, entry, version)
        self.hook("seal:after_commit")
        current = index_key(fleet_id, run_id, version)
        for key in list(self.blobs.list(f"{run_prefix(fleet_id, run_id)}/warm/index/")):
            if key < current:
                self.blobs.delete(key)

    def _retire_snapshots(self, fleet_id: str, run_id: str) -> None:
        retiring = self.repo.mark_retiring(fleet_id, run_id, self.config.keep_snapshots)
        for snapshot in retiring:
            self.blobs.delete(snapshot.key)
            self.hook("retention:mid")
        if retiring:
            self.repo.drop_snapshots(fleet_id, run_id, [s.iteration for s in retiring])

    # -- reading --------------------------------------------------------------

    def _head(self, fleet_id: str, run_id: str) -> RunHead:
        head = self.repo.head(fleet_id, run_id)
        if head is None:
            raise NotFound(f"run {run_id} has no recorded iterations in fleet {fleet_id}",
                           reason="RUN_NOT_FOUND")
        return head

    def last_iteration(self, fleet_id: str, run_id: str) -> int:
        return self._head(fleet_id, run_id).last_iter

    def _segment(self, entry: SegmentEntry) -> list[WarmLine]:
        with self._cache_lock:
            cached = self._segments.get(entry.key)
            if cached is not None:
                self._segments.move_to_end(entry.key)
                return cached
        data = b"".join(self.blobs.open(entry.key))
        if digest_of(data) != entry.sha256:
            raise IntegrityError(f"warm segment {entry.key} does not match its recorded digest; "
                                 "run `engram compactor verify`", reason="SEGMENT_TAMPERED")
        lines = [WarmLine.parse(text) for text in parse_segment(data)]
        with self._cache_lock:
            self._segments[entry.key] = lines
            while len(self._segments) > _CACHED_SEGMENTS:
                self._segments.popitem(last=False)
        return lines

    def summaries(self, fleet_id: str, run_id: str, first: int, last: int) -> list[WarmLine]:
        """Warm lines ``first..last`` across sealed segments and the database."""
        found: list[WarmLine] = []
        for entry in self.repo.sealed_segments(fleet_id, run_id):
            if entry.last_iter < first or entry.first_iter > last:
                continue
            found.extend(x for x in self._segment(entry) if first <= x.iteration <= last)
        found.extend(self.repo.db_lines(fleet_id, run_id, first, last))
        return found

    def summary(self, fleet_id: str, run_id: str, iteration: int) -> WarmLine:
        head = self._head(fleet_id, run_id)
        if not 1 <= iteration <= head.last_iter:
            raise NotFound(f"run {run_id} has iterations 1..{head.last_iter}, not {iteration}",
                           reason="ITERATION_NOT_FOUND")
        lines = self.summaries(fleet_id, run_id, iteration, iteration)
        if len(lines) != 1:
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
        hot = self.repo.hot(fleet_id, run_id, iteration)
        if hot is not None:
            self._check_detail(line, hot.detail_json, hot.guardrails_json, "hot ring")
            return Reconstruction(line, DetailSource.HOT, hot.detail_json, hot.guardrails_json,
                                  iteration)
        base = self.repo.stored_snapshot_at_or_before(fleet_id, run_id, iteration)
        if base is None:
            return Reconstruction(line, DetailSource.SUMMARY_ONLY)
        content = self._load_snapshot(base)
        if base.iteration == iteration:
            self._check_detail(line, content.detail_json, content.guardrails_json, base.key)
            return Reconstruction(line, DetailSource.COLD_SNAPSHOT, content.detail_json,
                                  content.guardrails_json, iteration)
        trail = self.summaries(fleet_id, run_id, base.iteration, iteration)
        if trail[0].hash != content.summary.hash or trail[0].iteration != base.iteration:
            raise IntegrityError(f"snapshot {base.key} does not match the warm log",
                                 reason="SNAPSHOT_MISMATCH")
        self._check_detail(trail[0], content.detail_json, content.guardrails_json, base.key)
        return Reconstruction(line, DetailSource.BASE_SNAPSHOT, content.detail_json,
                              content.guardrails_json, base.iteration, tuple(trail[1:]))

    def _load_snapshot(self, snapshot: SnapshotInfo) -> SnapshotContent:
        data = b"".join(self.blobs.open(snapshot.key))
        if digest_of(data) != snapshot.sha256:
            raise IntegrityError(f"cold snapshot {snapshot.key} does not match its digest",
                                 reason="SNAPSHOT_TAMPERED")
        try:
            return read_snapshot(data)
        except ValueError as exc:
            raise IntegrityError(f"cold snapshot {snapshot.key}: {exc}",
                                 reason="SNAPSHOT_TAMPERED") from None

    @staticmethod
    def _check_detail(line: WarmLine, detail: str, guardrails: str, where: str) -> None:
        if detail_digest(detail, guardrails) != line.detail_digest:
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

    def pins(self, fleet_id: str, run_id: str) -> list[Pin]:
        return self.repo.pins(fleet_id, run_id)

    def verify(self, fleet_id: str, run_id: str) -> VerifyReport:
        head = self._head(fleet_id, run_id)
        walker = ChainWalker(genesis_hash(fleet_id, run_id))
        problems: list[tuple[str, str]] = []
        sealed = self.repo.sealed_segments(fleet_id, run_id)
        problems.extend(self._verify_index(fleet_id, run_id, head, sealed))
        hashes: dict[int, str] = {}
        for entry in sealed:
            where = f"segment {entry.seq}"
            try:
                data = b"".join(self.blobs.open(entry.key))
            except NotFound:
                problems.append((where, f"segment file {entry.key} is missing"))
                continue
            if digest_of(data) != entry.sha256:
                problems.append((where, f"{entry.key} does not match the digest in the index"))
            texts = parse_segment(data)
            if len(texts) != entry.lines:
                problems.append((where, f"has {len(texts)} lines, the index says {entry.lines}"))
            for number, text in enumerate(texts, start=1):
                line = walker.feed_text(f"{where} line {number}", text)
                if line is not None:
                    hashes[line.iteration] = line.hash
        for iteration, text in self.repo.db_line_texts(fleet_id, run_id):
            line = walker.feed_text(f"active line {iteration}", text)
            if line is not None:
                hashes[line.iteration] = line.hash
        problems.extend((p.location, p.detail) for p in walker.problems)
        if walker.expected_iter - 1 != head.last_iter or walker.expected_prev != head.head_hash:
            problems.append(("head", f"the run's head is iteration {head.last_iter}; the warm "
                                     f"log ends at {walker.expected_iter - 1} with another hash"))
        checked = 0
        for snapshot in self.repo.snapshots(fleet_id, run_id, SnapshotState.STORED):
            checked += 1
            where = f"snapshot {snapshot.iteration}"
            try:
                content = self._load_snapshot(snapshot)
            except (NotFound, IntegrityError) as exc:
                problems.append((where, str(exc)))
                continue
            if hashes.get(snapshot.iteration) != content.summary.hash:
                problems.append((where, "its summary is not the warm log's line"))
            elif detail_digest(content.detail_json, content.guardrails_json) != \
                    content.summary.detail_digest:
                problems.append((where, "its detail does not match the line's detailDigest"))
        return VerifyReport(walker.checked, len(sealed), checked, head.last_iter, head.head_hash,
                            tuple(problems))

    def _verify_index(self, fleet_id: str, run_id: str, head: RunHead,
                      sealed: list[SegmentEntry]) -> list[tuple[str, str]]:
        if not sealed:
            return []
        key = index_key(fleet_id, run_id, head.index_version)
        try:
            listed = parse_index(b"".join(self.blobs.open(key)))
        except NotFound:
            return [("index", f"index file {key} is missing")]
        except (ValueError, KeyError, TypeError) as exc:
            return [("index", f"index file {key} is unreadable: {exc}")]
        if listed != sealed:
            return [("index", f"index file {key} does not list the sealed segments")]
        return []

    def index_entries(self, fleet_id: str, run_id: str) -> list[SegmentEntry]:
        """The newest index file's segment list (what operators and tools read)."""
        head = self._head(fleet_id, run_id)
        if head.index_version == 0:
            return []
        return parse_index(b"".join(self.blobs.open(index_key(fleet_id, run_id,
                                                               head.index_version))))
