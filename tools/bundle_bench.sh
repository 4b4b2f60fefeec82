#!/bin/bash
# Bundle export/import rates (docs/bundle.md): N records, N/10 events, N/100 iterations and MB
# megabytes of artifacts (10 MB each) in one `engram up` stack (SQLite), exported, imported twice into a
# second, exported again; the carried parts and blobs of both exports compared.
# Usage: N=10000 MB=100 tools/bundle_bench.sh   (figures in $DIR/*.json and $DIR/*.time)
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PATH=$PWD/.venv/bin:$PATH ENGRAM_SHARD_EMBEDDER=none
N=${N:-10000}; MB=${MB:-100}; DIR=${DIR:-/tmp/bundle-bench}
rm -rf $DIR/a $DIR/b $DIR/*.bundle; mkdir -p $DIR/a $DIR/b
ENGRAM_HOME=$DIR/a engram up --base-port 19200 > $DIR/a.log 2>&1 & echo $! > $DIR/a.pid
ENGRAM_HOME=$DIR/b engram up --base-port 19300 > $DIR/b.log 2>&1 & echo $! > $DIR/b.pid
trap 'kill $(cat $DIR/a.pid) $(cat $DIR/b.pid)' EXIT
for h in a b; do until [ -f $DIR/$h/endpoints.json ] && ENGRAM_HOME=$DIR/$h engram status >/dev/null 2>&1; do sleep 2; done; done
python - <<PY
import json, random
random.seed(1)
words = "retry idempotency gateway protocol shard memory lesson decision incident review deploy".split()
with open("$DIR/records.jsonl", "w") as f:
    for i in range($N):
        f.write(json.dumps({"content": f"memory {i}: " + " ".join(random.choices(words, k=20)),
                            "run_id": f"run-{i % 10}", "tags": ["bench"]}) + "\n")
PY
export ENGRAM_HOME=$DIR/a
engram import $DIR/records.jsonl --json > $DIR/load.json
engram runs start run-0 --json > /dev/null
for i in $(seq 1 $((MB / 10))); do head -c 10000000 /dev/urandom > $DIR/blob; engram artifacts put $DIR/blob --run run-0 --step s$i --json > /dev/null; done
python - <<PY
from engram.client import ClientSettings
from engram.client.artifacts import ArtifactsClient
settings = ClientSettings()
with ArtifactsClient(settings.artifacts_addr, settings.resolve_token()) as art:
    for i in range($N // 10):
        art.append_event("run-0", "tool.called", {"tool": "search", "i": i})
    art.create_snapshot("run-0", {"events": $N // 10})
from engram.client.compactor import CompactorClient, iteration_from_json
with CompactorClient(settings.compactor_addr, settings.resolve_token()) as comp:
    for i in range(1, $N // 100 + 1):
        comp.record("run-0", iteration_from_json({"iter": i, "planDigest": f"p{i}",
                    "status": "ok", "detail": {"step": i, "log": ["line"] * 20}}))
PY
/usr/bin/time -v engram export --fleet default -o $DIR/a.bundle --json > $DIR/export.json 2> $DIR/export.time
export ENGRAM_HOME=$DIR/b
/usr/bin/time -v engram import-bundle $DIR/a.bundle --json > $DIR/import.json 2> $DIR/import.time
/usr/bin/time -v engram import-bundle $DIR/a.bundle --json > $DIR/import2.json 2> $DIR/import2.time
engram export --fleet default -o $DIR/b.bundle --json > $DIR/export2.json
python - <<PY
from engram.bundle import BundleReader
with BundleReader("$DIR/a.bundle") as a, BundleReader("$DIR/b.bundle") as b:
    one = {m.path: m.sha256 for m in a.verify().members}
    two = {m.path: m.sha256 for m in b.verify().members}
carried = [p for p in one if p.startswith("blobs/") or p in (
    "parts/domains.jsonl", "parts/records.jsonl", "parts/runs.jsonl", "parts/artifacts.jsonl",
    "parts/events.jsonl", "parts/snapshots.jsonl", "parts/manifests.jsonl",
    "parts/evidence.jsonl", "parts/iterations.jsonl", "parts/decisions.jsonl",
    "parts/erasures.jsonl", "parts/tombstones.jsonl")]
for path in sorted(carried):
    print(path, "identical" if one[path] == two.get(path) else "DIFFERENT")
PY
