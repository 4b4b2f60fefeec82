"""IterationLog over real SQLite + file:// blobs: tiers, rotation, index, retention, pins."""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Sequence

import pytest

from services.common.blobstore.file import FileBlobStore
from services.common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from services.compactor.domain.blob_layout import parse_segment
from services.compactor.domain.model import (
    AppendOutcome,
    AppendRequest,
    DetailSource,
    SnapshotState,
)
from services.compactor.domain.warm_chain import WarmLine, detail_digest, genesis_hash
from services.compactor.repository import CompactorRepository, ConcurrentAppend, Planner
from services.compactor.service import IterationLog
from tests.unit.compactor.support import LogFactory, make_iteration

F, R = "fleet-a", "run-1"


def test_record_appends_a_chained_line_and_keeps_the_last_n_hot(make_log: LogFactory) -> None:
    log = make_log(hot_size=3)
    lines = [log.record(F, R, make_iteration(n)).line for n in range(1, 8)]
    assert lines[0].prev_hash == genesis_hash(F, R)
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(lines))
    assert all(line.computed_hash() == line.hash for line in lines)
    recent = log.recent(F, R, None, 50)
    assert [line.iteration for line, _d, _g in recent] == [7, 6, 5]
    item = make_iteration(7).validated()
    assert recent[0][1] == item.detail_json and recent[0][2] == item.guardrails_json
    assert [x.iteration for x in log.summaries(F, R, 1, 7)] == list(range(1, 8))


def test_retry_is_idempotent_and_a_conflicting_rewrite_is_refused(make_log: LogFactory) -> None:
    log = make_log()
    first = log.record(F, R, make_iteration(1))
    again = log.record(F, R, make_iteration(1))
    assert first.created and not again.created and again.line == first.line
    with pytest.raises(AlreadyExists):
        log.record(F, R, make_iteration(1, status="failed"))
    with pytest.raises(FailedPrecondition, match="next one to record is 2"):
        log.record(F, R, make_iteration(3))
    assert log.last_iteration(F, R) == 1


class _AlwaysOvertaken(CompactorRepository):
    """Every group transaction loses to another writer (the constraint conflict it raises)."""

    attempts = 0

    def append_group(self, requests: Sequence[AppendRequest],
                     plan_for: Planner) -> list[AppendOutcome]:
        self.attempts += 1
        raise ConcurrentAppend()


def test_running_out_of_retries_is_aborted_not_already_recorded(
        make_log: LogFactory, blobs: FileBlobStore) -> None:
    repo = _AlwaysOvertaken(make_log().repo.db)
    log = IterationLog(repo, blobs)
    with pytest.raises(Aborted) as aborted:
        log.record(F, R, make_iteration(1))
    assert aborted.value.code == "ABORTED" and aborted.value.reason == "CONCURRENT_APPEND"
    assert repo.attempts == 5
    assert repo.head(F, R) is None


def test_tier_work_failing_after_the_commit_is_not_a_failed_write(
        make_log: LogFactory, blobs: FileBlobStore) -> None:
    def disk_full(step: str) -> None:
        if step == "snapshot:before_rename":
            raise OSError("no space left on device")

    log = make_log(disk_full, snapshot_every=2)
    log.record(F, R, make_iteration(1))
    second = log.record(F, R, make_iteration(2))
    assert second.created and second.line.iteration == 2
    head = log.repo.head(F, R)
    assert head is not None and head.pending_work
    assert log.repo.snapshots(F, R, SnapshotState.PENDING)
    assert not list(blobs.list(f"{F}/{R}/cold/"))
    repaired = make_log(snapshot_every=2)
    assert repaired.recover() == 1
    assert [s.iteration for s in repaired.repo.snapshots(F, R, SnapshotState.STORED)] == [2]
    assert repaired.verify(F, R).ok


def test_zero_means_next_and_bad_input_is_refused(make_log: LogFactory) -> None:
    log = make_log()
    log.record(F, R, make_iteration(1))
    item = make_iteration(0)
    assert log.record(F, R, item).line.iteration == 2
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        log.record(F, R, make_iteration(3).__class__(**{**make_iteration(3).__dict__,
                                                         "detail_json": "{oops"}))
    with pytest.raises(InvalidArgument, match="status"):
        log.record(F, R, make_iteration(3, status=""))
    with pytest.raises(NotFound):
        log.reconstruct(F, "no-such-run", 1)


def test_rotation_at_the_threshold_and_index_file_contents(
        make_log: LogFactory, blobs: FileBlobStore) -> None:
    threshold = 1200
    log = make_log(rotate_bytes=threshold, snapshot_every=1000)
    recorded = [log.record(F, R, make_iteration(n)).line for n in range(1, 41)]
    entries = log.index_entries(F, R)
    assert len(entries) >= 3
    covered = []
    for entry in entries:
        data = b"".join(blobs.open(entry.key))
        texts = parse_segment(data)
        sizes = [len(t.encode()) + 1 for t in texts]
        assert len(data) == entry.bytes == sum(sizes) <= threshold
        # rotation happened exactly when the next line would have crossed the threshold
        next_line = recorded[entry.last_iter]
        assert entry.bytes + len(next_line.text().encode()) + 1 > threshold
        assert entry.lines == len(texts) and entry.first_iter == WarmLine.parse(texts[0]).iteration
        assert entry.first_prev_hash == WarmLine.parse(texts[0]).prev_hash
        assert entry.last_hash == WarmLine.parse(texts[-1]).hash
        assert entry.key.endswith(".jsonl") and f"/warm/segments/{entry.seq:06d}-" in entry.key
        covered.extend(WarmLine.parse(t).iteration for t in texts)
    assert covered == list(range(1, entries[-1].last_iter + 1))
    index_keys = list(blobs.list(f"{F}/{R}/warm/index/"))
    assert len(index_keys) == 1 and json.loads(b"".join(blobs.open(index_keys[0])))[
        "version"] == len(entries)
    assert log.summaries(F, R, 1, 40) == recorded
    assert log.verify(F, R).ok


def test_rotation_is_deterministic_given_content(
        make_log: LogFactory, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same lines (their salts included: a format-2 line's are random, so recording the
    same iterations twice gives other lines) give byte-identical blobs: here a log's lines and
    details imported into a second store."""
    from services.common.db import Database
    from services.compactor.domain.model import TierConfig
    from services.compactor.repository import CompactorRepository
    from services.compactor.server import MIGRATIONS
    from services.compactor.service import ImportedIteration, IterationLog

    digests = []
    imported: list[ImportedIteration] = []
    for _ in range(2):
        root = tmp_path_factory.mktemp("det")
        db = Database(f"sqlite:///{root / 'c.db'}")
        db.upgrade(MIGRATIONS)
        blobs = FileBlobStore(root / "blobs")
        log = IterationLog(CompactorRepository(db), blobs,
                           TierConfig(rotate_bytes=900, snapshot_every=5))
        if not imported:
            for n in range(1, 31):
                item = make_iteration(n).validated()
                line = log.record(F, R, item).line
                imported.append(ImportedIteration(line, item.detail_json,
                                                  item.guardrails_json))
        else:
            assert log.import_iterations(F, R, imported) == (30, 0)
        digests.append({k: b"".join(blobs.open(k)) for k in blobs.list()})
        db.dispose()
    assert all(item.line.format == 2 for item in imported)
    assert digests[0] == digests[1]


def test_snapshots_every_k_and_retention_keeps_the_last_ones(
        make_log: LogFactory, blobs: FileBlobStore) -> None:
    log = make_log(snapshot_every=5, keep_snapshots=3)
    for n in range(1, 41):
        log.record(F, R, make_iteration(n))
    stored = log.repo.snapshots(F, R)
    assert [s.iteration for s in stored] == [30, 35, 40]
    assert all(s.state is SnapshotState.STORED for s in stored)
    assert [k.rsplit("/", 1)[1] for k in blobs.list(f"{F}/{R}/cold/")] == [
        "0000000030.json.gz", "0000000035.json.gz", "0000000040.json.gz"]
    payload = json.loads(gzip.decompress(b"".join(blobs.open(stored[0].key))))
    item = make_iteration(30).validated()
    assert payload["detail"] == json.loads(item.detail_json)
    assert payload["guardrails"] == json.loads(item.guardrails_json)


def test_pins_keep_snapshots_past_retention(make_log: LogFactory) -> None:
    log = make_log(snapshot_every=5, keep_snapshots=2, hot_size=2)
    for n in range(1, 13):
        log.record(F, R, make_iteration(n))
    pinned_base = log.pin(F, R, 7, "risk spike")
    assert pinned_base.snapshot_iteration == 5
    hot_pin = log.pin(F, R, 12, "guardrail failed")
    assert hot_pin.snapshot_iteration == 12
    for n in range(13, 41):
        log.record(F, R, make_iteration(n))
    kept = [s.iteration for s in log.repo.snapshots(F, R)]
    assert kept == [5, 12, 35, 40]
    assert log.reconstruct(F, R, 12).source is DetailSource.COLD_SNAPSHOT
    assert log.reconstruct(F, R, 7).base_iteration == 5
    assert log.pin(F, R, 7, "again") == pinned_base
    assert log.verify(F, R).ok


def test_reconstruction_equals_what_was_recorded_for_every_iteration(
        make_log: LogFactory) -> None:
    log = make_log(rotate_bytes=4000, snapshot_every=7, keep_snapshots=4, hot_size=5)
    total = 120
    recorded = {}
    for n in range(1, total + 1):
        recorded[n] = (log.record(F, R, make_iteration(n)).line, make_iteration(n).validated())
    snapshots = {s.iteration for s in log.repo.snapshots(F, R)}
    for n in range(1, total + 1):
        line, item = recorded[n]
        view = log.reconstruct(F, R, n)
        assert view.summary == line
        if n > total - 5:
            assert view.source is DetailSource.HOT
        elif n in snapshots:
            assert view.source is DetailSource.COLD_SNAPSHOT
        else:
            bases = [s for s in snapshots if s < n]
            if not bases:
                assert view.source is DetailSource.SUMMARY_ONLY
                continue
            assert view.source is DetailSource.BASE_SNAPSHOT
            assert view.base_iteration == max(bases)
            assert [x for x in view.trail] == [recorded[i][0]
                                               for i in range(max(bases) + 1, n + 1)]
            line, item = recorded[view.base_iteration]
        assert view.detail_json == item.detail_json
        assert view.guardrails_json == item.guardrails_json
        assert line.commits_detail(view.detail_json, view.guardrails_json)
        assert detail_digest(view.detail_json, view.guardrails_json) != line.detail_digest


def test_a_retried_next_record_with_a_request_id_is_recorded_once(make_log: LogFactory) -> None:
    log = make_log()
    log.record(F, R, make_iteration(1))
    nxt = make_iteration(0)
    first = log.record(F, R, nxt, "req-a")
    again = log.record(F, R, nxt, "req-a")
    assert first.created and first.line.iteration == 2
    assert not again.created and again.line == first.line
    assert log.last_iteration(F, R) == 2
    with pytest.raises(AlreadyExists):
        log.record(F, R, make_iteration(2), "req-a")  # not the content it recorded
    with pytest.raises(AlreadyExists) as reused:
        log.record(F, R, make_iteration(0, status="failed"), "req-a")
    assert reused.value.reason == "REQUEST_ID_REUSED"
    assert log.record(F, "run-2", nxt, "req-a").created  # keys are per run
    assert log.record(F, R, nxt, "req-b").line.iteration == 3
    with pytest.raises(InvalidArgument):
        log.record(F, R, nxt, "k" * 129)
    assert log.last_iteration(F, R) == 3


def test_a_request_id_repeated_within_one_group_commit_records_once(
        make_log: LogFactory) -> None:
    log = make_log()
    outcomes = log.repo.append_group(
        [AppendRequest(F, R, make_iteration(0).validated(), "d", "same"),
         AppendRequest(F, R, make_iteration(0).validated(), "d", "same")], log._plan)
    assert outcomes[0].plan is not None and outcomes[0].plan.line.iteration == 1
    assert outcomes[1].plan is None and outcomes[1].recorded_iteration == 1
    assert log.last_iteration(F, R) == 1


def test_verify_reads_one_snapshot_file_at_a_time(make_log: LogFactory) -> None:
    """Found by review (2026-11-30): VerifyRun (an agent's read) held every stored snapshot
    file of the run at once; pinned snapshots of megabytes, up to a thousand a run, made that
    gigabytes. Now each is read, checked and let go before the next."""
    import tracemalloc

    log = make_log(snapshot_every=1, keep_snapshots=60, hot_size=1)
    for n in range(1, 61):
        log.record(F, R, make_iteration(n, size=400_000))
    stored = log.repo.snapshots(F, R)
    assert len(stored) == 60
    largest = max(s.size_bytes for s in stored)
    tracemalloc.start()
    try:
        assert log.verify(F, R).ok
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one file, its content and its parse at a time (~10 x largest); all 60 files at once
    # were ~80 x
    assert peak < 25 * largest, f"peak {peak} bytes for snapshots of {largest} bytes at most"


def test_a_trail_past_the_limit_is_refused_naming_its_base(
        make_log: LogFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review (2026-11-30): a pin keeps its snapshot for good, so the nearest one
    before an iteration may be any distance back, and every line between was read, held and
    sent (past gRPC's reply limit near 58,000). Past MAX_TRAIL lines it is refused, naming
    the base, for ListSummaries to page."""
    from services.compactor import service as compactor_service

    monkeypatch.setattr(compactor_service, "MAX_TRAIL", 5)
    log = make_log(snapshot_every=1000, keep_snapshots=2, hot_size=2)
    log.record(F, R, make_iteration(1))
    log.pin(F, R, 1, "early anomaly")
    for n in range(2, 21):
        log.record(F, R, make_iteration(n))
    assert log.reconstruct(F, R, 6).base_iteration == 1  # 5 lines: carried
    with pytest.raises(FailedPrecondition) as refused:
        log.reconstruct(F, R, 7)
    assert refused.value.reason == "TRAIL_TOO_LONG"
    assert refused.value.metadata["base_iteration"] == "1"
