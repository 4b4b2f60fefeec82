"""How long saving one fleet's search index holds that fleet's lock, and what others wait.

    .venv/bin/python tools/index_save_stall.py --records 1000000 --rounds 3

Builds one synthetic fleet in this process (13 words a record from a 50,000-word vocabulary,
runs of 20 records, as docs/scaling.md measured), then saves it ``--rounds`` times the way the
shard's index does (services/shard/search/index.py): ``FleetIndex.snapshot_copy`` under the
fleet's lock, then the copy pickled (``fleet_frame``) and written (``write_snapshot``) outside
it. Meanwhile one thread takes the fleet's lock every millisecond, as a search of that fleet
would, and another only sleeps a millisecond at a time: their longest waits are what a search
of the fleet and any other thread of the process (other fleets' searches, gRPC) see. Prints
one JSON object: medians over the rounds, and the build's rate and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from services.shard.search.fleet_index import ContextSettings, FleetIndex
from services.shard.search.snapshot import SnapshotHeader, fleet_frame, write_snapshot

VOCABULARY = 50_000
WORDS = 13
RUN = 20


class _Watch(threading.Thread):
    """Every millisecond: take ``lock`` (if given) and note the longest wait beyond 1 ms."""

    def __init__(self, lock: threading.Lock | None) -> None:
        super().__init__(daemon=True)
        self.lock, self.longest, self.stop = lock, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
            if self.lock is not None:
                with self.lock:
                    pass
            time.sleep(0.001)
            self.longest = max(self.longest, time.perf_counter() - began - 0.001)


def build(records: int, seed: int = 7) -> FleetIndex:
    rng = random.Random(seed)
    words = [f"w{n}" for n in range(VOCABULARY)]
    fleet = FleetIndex(0, ContextSettings())
    began = time.perf_counter()
    for n in range(records):
        fleet.add(f"{n:032x}", f"run-{n // RUN}", " ".join(rng.choices(words, k=WORDS)))
        if n and n % 100_000 == 0:
            print(f"built {n:,} records, {n / (time.perf_counter() - began):,.0f}/s",
                  file=sys.stderr, flush=True)
    return fleet


def save_once(fleet: FleetIndex, lock: threading.Lock, path: Path) -> dict[str, float]:
    searcher, other = _Watch(lock), _Watch(None)
    searcher.start()
    other.start()
    time.sleep(0.05)
    began = time.perf_counter()
    with lock:
        copy = fleet.snapshot_copy()
    held = time.perf_counter() - began
    frame = fleet_frame("fleet", copy)
    write_snapshot(path, SnapshotHeader(3, 0, [], len(fleet), "", "", len(frame[1]), ""),
                   [frame])
    whole = time.perf_counter() - began
    time.sleep(0.05)
    searcher.stop.set()
    other.stop.set()
    searcher.join()
    other.join()
    return {"lock_held_ms": held * 1000, "search_longest_wait_ms": searcher.longest * 1000,
            "other_thread_longest_gap_ms": other.longest * 1000, "whole_save_s": whole,
            "snapshot_mb": path.stat().st_size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records in the fleet")
    parser.add_argument("--rounds", type=int, default=3, help="saves to take the median of")
    args = parser.parse_args()
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be at least 1")
    began = time.perf_counter()
    fleet = build(args.records)
    built = time.perf_counter() - began
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="engram-save-") as tmp:
        rounds = [save_once(fleet, lock, Path(tmp) / "index.snapshot")
                  for _ in range(args.rounds)]
    result: dict[str, object] = {
        "records": args.records, "rounds": args.rounds,
        "build_records_per_s": round(args.records / built),
        **{key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
