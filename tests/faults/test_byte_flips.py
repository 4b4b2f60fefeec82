"""Random single-byte flips in every store, found by the verify commands (item 4 of issue 16).

Each store is filled through the services, the services are stopped, one byte is changed in
each of N distinct stored items (as many items again are left untouched), the services are
started again and the store's verify command is run:

- records: one field of a `records` row (content, author, run, domain, source, tags, metadata,
  the two hashes); found by VerifyRecords of each id and SnapshotForRun(verify) of each run.
- blobs: one byte of an artifact's blob file; found by VerifyArtifacts (`engram artifacts
  verify`).
- events: the type, payload, salt or payload commitment of one `events` row (format 2, each
  column in turn); found by ReplayEvents of its run (the event hash chain, each commitment
  recomputed from payload and salt).
- warm: one byte of a warm line, in a sealed segment file or an active line in the compactor
  DB; found by VerifyRun (`engram compactor verify RUN`).
- snapshots: one byte of a `snapshots` row's state or salt (format 2, in turn); VerifyArtifacts
  and every read re-hash it.
- manifests: one byte of a `manifests` row's content, salt or content hash (format 2, in turn),
  half of them built for no run; found by VerifyArtifacts of the fleet, and GetManifest of each
  refuses exactly those (DATA_LOSS).

Criterion: 100% of the flipped items reported, 0 untouched items reported (no false alarm).
110 flips in `make test` (40 records, 20 blobs, 15 events, 15 warm, 10 snapshots, 10
manifests), 1,100 in `make soak`.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from engram.client import (
    ArtifactsClient,
    CompactorClient,
    EngramRpcError,
    ShardClient,
    record_input,
)
from engram.compactor.v1 import compactor_service_pb2 as cpb
from tests.faults.conftest import Stack, scale

pytestmark = [pytest.mark.faults, pytest.mark.slow]

FLIPS = {"records": scale(40, 400), "blobs": scale(20, 200), "events": scale(15, 150),
         "warm": scale(15, 150), "snapshots": scale(10, 100), "manifests": scale(10, 100)}
PRINTABLE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 {}[]\":,.-_"
RECORD_FIELDS = ("content", "agent_id", "run_id", "domain", "source", "tags_json",
                 "metadata_json", "content_hash", "record_hash")
EVENT_FIELDS = ("type", "payload_json", "salt", "payload_commitment")
SNAPSHOT_FIELDS = ("state_json", "salt")
MANIFEST_FIELDS = ("content_json", "salt", "content_hash")


def flip_text(value: str, rng: random.Random) -> str:
    at = rng.randrange(len(value))
    return value[:at] + rng.choice([c for c in PRINTABLE if c != value[at]]) + value[at + 1:]


def flip_file(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))


def flip_row(db: Path, table: str, column: str, where: str, key: tuple[object, ...],
             rng: random.Random) -> None:
    with sqlite3.connect(db) as conn:
        (value,) = conn.execute(f"SELECT {column} FROM {table} WHERE {where}", key).fetchone()
        conn.execute(f"UPDATE {table} SET {column}=? WHERE {where}",
                     (flip_text(str(value), rng), *key))


def agent_client(stack: Stack, kind: type, service: str, timeout: float = 60) -> object:
    return kind(stack.address(service), stack.token("flipper"), timeout=timeout)


# -- each store: fill, flip, verify; each returns (flipped, reported) as sets of item keys --

def records(stack: Stack, n: int, rng: random.Random) -> tuple[set[str], set[str]]:
    stack.start("governance")
    stack.start("shard")
    runs = [f"run-{i}" for i in range(max(2, n // 10))]
    with ShardClient(stack.address("shard"), stack.token("flipper"), timeout=120) as shard:
        ids: list[str] = []
        for start in range(0, 2 * n, 50):
            batch = [record_input(f"fact {i}: the deploy takes {rng.random()} minutes",
                                  run_id=runs[i % len(runs)], tags=["ops", f"t{i % 3}"],
                                  metadata={"k": str(i)}, source="faults")
                     for i in range(start, min(2 * n, start + 50))]
            ids += [r.record.id for r in shard.add_many(batch, request_id=f"b{start}").results]
    stack.stop_all()
    flipped = set(rng.sample(ids, n))
    for record_id in flipped:
        flip_row(stack.db_path("shard"), "records", rng.choice(RECORD_FIELDS), "id=?",
                 (record_id,), rng)
    stack.start("governance")
    stack.start("shard")
    with ShardClient(stack.address("shard"), stack.token("flipper"), timeout=120) as shard:
        # One call over the whole fleet: an unreadable row is one more failure, not the end.
        report = shard.verify(all_records=True)
        assert report.checked == len(ids), report.checked
        reported = {f.id for f in report.failures}
        for run in runs:  # each run holding a flipped record must fail its verified snapshot
            try:
                list(shard.snapshot(run, verify=True))
                snapshot_ok = True
            except EngramRpcError as error:
                assert error.code.name == "DATA_LOSS", error
                snapshot_ok = False
            assert snapshot_ok == (not (reported & _ids_of_run(stack, run))), run
    return flipped, reported


def _ids_of_run(stack: Stack, run: str) -> set[str]:
    with sqlite3.connect(stack.db_path("shard")) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM records WHERE run_id=?", (run,))}


def blobs(stack: Stack, n: int, rng: random.Random) -> tuple[set[str], set[str]]:
    stack.start("artifacts")
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        ids = []
        for i in range(2 * n):
            run = f"run-{i % 5}"
            if i < 5:
                art.start_run(run)
            blob = rng.randbytes(rng.randrange(1024, 4096))
            ids.append(art.upload([blob], run_id=run, step_id="s", name=f"a{i}.bin")
                       .artifact_id)
    stack.stop_all()
    flipped = set(rng.sample(ids, n))
    with sqlite3.connect(stack.db_path("artifacts")) as conn:
        paths = dict(conn.execute("SELECT artifact_id, path FROM artifacts"))
    root = stack.home / "artifacts" / "blobs"
    for artifact_id in flipped:
        flip_file(_blob_file(root, paths[artifact_id]), rng)
    stack.start("artifacts")
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        report = art.verify()
    assert report.checked == 2 * n
    return flipped, {p.artifact_id for p in report.problems}


def _blob_file(root: Path, path: str) -> Path:
    direct = root / path
    if direct.is_file():
        return direct
    (found,) = [p for p in root.rglob(Path(path).name) if str(p).endswith(path)]
    return found


def events(stack: Stack, n: int, rng: random.Random) -> tuple[set[str], set[str]]:
    stack.start("artifacts")
    runs = [f"run-{i}" for i in range(2 * n)]
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        for run in runs:
            art.start_run(run)
            for j in range(5):
                art.append_event(run, f"tool.step{j}", {"tool": "search", "n": j,
                                                         "q": str(rng.random())})
    stack.stop_all()
    _all_format_2(stack, "events", len(runs) * 5)
    flipped = set(rng.sample(runs, n))
    for i, run in enumerate(sorted(flipped)):  # every column is flipped (n >= 4)
        flip_row(stack.db_path("artifacts"), "events", EVENT_FIELDS[i % len(EVENT_FIELDS)],
                 "run_id=? AND seq=?", (run, rng.randrange(1, 6)), rng)
    stack.start("artifacts")
    reported = set()
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        for run in runs:
            try:
                list(art.replay(run))
            except EngramRpcError as error:
                assert error.code.name == "DATA_LOSS", error
                reported.add(run)
    return flipped, reported


def _all_format_2(stack: Stack, table: str, rows: int) -> None:
    """Every row written is format 2, with a salt (and an event its payload commitment), so
    the flips of those columns hit what they are meant to."""
    with sqlite3.connect(stack.db_path("artifacts")) as conn:
        (salted,) = conn.execute(f"SELECT count(*) FROM {table} WHERE format=2 "
                                 "AND length(salt)=64").fetchone()
        (committed,) = conn.execute("SELECT count(*) FROM events WHERE format=2 "
                                    "AND length(payload_commitment)=64").fetchone()
    assert salted == rows, (table, salted, rows)
    assert table != "events" or committed == rows, (committed, rows)


def warm(stack: Stack, n: int, rng: random.Random) -> tuple[set[str], set[str]]:
    stack.extra["compactor"] = {"ENGRAM_COMPACTOR_ROTATE_BYTES": "1024"}
    stack.ports["shard"] = 9  # the iteration log needs no shard (only memory compaction does)
    stack.start("compactor")
    runs = [f"run-{i}" for i in range(2 * n)]
    with CompactorClient(stack.address("compactor"), stack.token("flipper")) as comp:
        for run in runs:
            for it in range(1, 13):
                comp.record(run, cpb.IterationInput(
                    iteration=it, plan_digest=f"plan{it}-{rng.random()}",
                    parent_digest=f"plan{it - 1}", files_touched=it, net_add=3 * it,
                    status="ok", detail_json='{"notes": "step"}'))
    stack.stop_all()
    flipped = set(rng.sample(runs, n))
    segments = stack.home / "compactor" / "blobs"
    for run in flipped:
        sealed = sorted(segments.glob(f"*/{run}/warm/segments/*.jsonl"))
        if sealed and rng.random() < 0.5:
            flip_file(rng.choice(sealed), rng)
        else:
            with sqlite3.connect(stack.db_path("compactor")) as conn:
                (iteration,) = rng.choice(conn.execute(
                    "SELECT iteration FROM compactor_warm_lines WHERE run_id=?",
                    (run,)).fetchall())
            flip_row(stack.db_path("compactor"), "compactor_warm_lines", "line",
                     "run_id=? AND iteration=?", (run, iteration), rng)
    stack.start("compactor")
    with CompactorClient(stack.address("compactor"), stack.token("flipper")) as comp:
        reported = {run for run in runs if not comp.verify(run).ok}
    return flipped, reported


def snapshots(stack: Stack, n: int, rng: random.Random) -> tuple[set[str], set[str]]:
    stack.start("artifacts")
    runs = [f"run-{i}" for i in range(2 * n)]
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        for run in runs:
            art.start_run(run)
            art.append_event(run, "tool.called", {"n": 1})
            art.create_snapshot(run, {"step": 1, "notes": f"state {rng.random()}"})
    stack.stop_all()
    _all_format_2(stack, "snapshots", len(runs))
    flipped = set(rng.sample(runs, n))
    for i, run in enumerate(sorted(flipped)):  # each column in turn
        flip_row(stack.db_path("artifacts"), "snapshots",
                 SNAPSHOT_FIELDS[i % len(SNAPSHOT_FIELDS)], "run_id=?", (run,), rng)
    stack.start("artifacts")
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        report = art.verify()
        assert not report.problems and report.snapshots_checked == len(runs)
        reported = {p.run_id for p in report.snapshot_problems}
        for run in runs:  # every read re-hashes too: latest, list, rehydrate
            for read in (art.latest_snapshot, lambda r: list(art.list_snapshots(r)),
                         art.rehydrate):
                try:
                    read(run)
                    assert run not in reported, f"{run}: verify found it, a read did not"
                except EngramRpcError as error:
                    assert error.code.name == "DATA_LOSS", error
                    assert run in reported, f"{run}: a read found it, verify did not"
    return flipped, reported


def manifests(stack: Stack, n: int, rng: random.Random) -> tuple[set[str], set[str]]:
    stack.start("artifacts")
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        art.start_run("run-m")
        ids = [art.create_manifest({"window": [f"rec-{i}"], "why": f"{rng.random()}"},
                                   run_id="run-m" if i % 2 else "").manifest.manifest_id
               for i in range(2 * n)]
    stack.stop_all()
    _all_format_2(stack, "manifests", len(ids))
    flipped = set(rng.sample(ids, n))
    for i, manifest_id in enumerate(sorted(flipped)):  # each column in turn
        flip_row(stack.db_path("artifacts"), "manifests",
                 MANIFEST_FIELDS[i % len(MANIFEST_FIELDS)], "manifest_id=?", (manifest_id,),
                 rng)
    stack.start("artifacts")
    with ArtifactsClient(stack.address("artifacts"), stack.token("flipper")) as art:
        report = art.verify()
        assert report.manifests_checked == len(ids)
        reported = {p.manifest_id for p in report.manifest_problems}
        for manifest_id in ids:  # every read re-hashes too
            try:
                art.get_manifest(manifest_id)
                assert manifest_id not in reported, f"{manifest_id}: a read did not find it"
            except EngramRpcError as error:
                assert error.code.name == "DATA_LOSS", error
                assert manifest_id in reported, f"{manifest_id}: verify did not find it"
    return flipped, reported


STORES: dict[str, Callable[[Stack, int, random.Random], tuple[set[str], set[str]]]] = {
    "records": records, "blobs": blobs, "events": events, "warm": warm, "snapshots": snapshots,
    "manifests": manifests}


@pytest.mark.parametrize("store", [
    "records", "blobs", "events", "warm",
    "snapshots", "manifests",
])
def test_every_flipped_byte_is_found_and_nothing_else(stack: Stack, store: str) -> None:
    rng = random.Random(f"flips-{store}")
    n = FLIPS[store]
    flipped, reported = STORES[store](stack, n, rng)
    missed, false_alarms = flipped - reported, reported - flipped
    print(f"{store}: {n} flipped, {len(flipped & reported)} found, {len(missed)} missed, "
          f"{len(false_alarms)} false alarms among {n} untouched")
    assert not missed, f"{len(missed)} of {n} flips not found: {sorted(missed)[:10]}"
    assert not false_alarms, f"untouched items reported: {sorted(false_alarms)[:10]}"
