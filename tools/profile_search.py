"""Search latency of a real shard at 10k records, optionally under py-spy.

Starts the bench's shard (`engram.bench._harness.shard_process`: SQLite, int8 MiniLM in its
embedder process, no governance), fills it with `engram bench search`'s records up to
``--size`` (kept in ``--home`` and reused on the next run, so a restart only rebuilds the
index), then times ``--searches`` queries per mode exactly as `engram bench chroma` does
(`engram.bench.search.searches`). With ``--py-spy PATH`` (a py-spy binary; not an Engram
dependency) it records the shard and its embedder process during one more pass of hybrid
queries and writes a flame graph and a raw collapsed-stack file beside ``--out``.

    .venv/bin/python tools/profile_search.py --home /tmp/prof-home --py-spy /path/to/py-spy
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import time
from pathlib import Path

from engram.bench._harness import shard_process
from engram.bench.search import ingest, searches, wait_indexed
from engram.client import ShardClient
from services.common.tokens import TokenSigner, ensure_keypair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--py-spy", dest="py_spy", default="")
    parser.add_argument("--spy-searches", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/profile-search"))
    args = parser.parse_args()
    args.home.mkdir(parents=True, exist_ok=True)
    token = TokenSigner.load(ensure_keypair(args.home).private).issue("bench", "bench", {"agent"})
    with (
        shard_process(args.home, embedder="minilm", timeout=300) as shard,
        ShardClient(shard.address, token) as client,
    ):
        wait_indexed(client)
        have = int(client.status().total_records)
        if have < args.size:
            print(f"ingest {have} -> {args.size}: "
                  f"{ingest(client, have, args.size):.0f} records/s", flush=True)
        for round_ in range(args.rounds):
            figures = searches(client, args.searches, ("hybrid", "semantic", "lexical"))
            print(f"round {round_}: {json.dumps(figures)}", flush=True)
        if args.py_spy:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen([
                args.py_spy, "record", "--pid", str(shard.pid), "--subprocesses", "--threads",
                "--rate", "500", "--format", "raw", "--output", f"{args.out}.txt",
            ])
            time.sleep(2)
            figures = searches(client, args.spy_searches, ("hybrid",))
            print(f"under py-spy: {json.dumps(figures)}", flush=True)
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on an interrupt
            spy.wait(timeout=60)


if __name__ == "__main__":
    main()
