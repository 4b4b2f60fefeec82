"""`engram bench artifacts`: streamed artifacts, metadata lookup and rehydrate, beside baselines.

In one run, on this machine: a raw gRPC echo (the RPC ceiling), a raw file
copy on the same disk (with fsync, as the service's put), raw boto3
put/get against a local moto server, and the artifacts service in its own
process (SQLite, file:// or s3://). Figures:

- upload/download of ``1 GB x scale`` through the service vs the raw copy, and
  the service's peak RSS while it streams;
- the same through s3:// vs raw boto3 on the same moto server
  (``128 MB x scale``: moto keeps objects in memory);
- GetArtifact p50 vs echo p50;
- Rehydrate p95 for a run with 1k events and one with ``100k x scale`` events,
  both with a snapshot every 1k events (the log is seeded straight into the
  database: the figure is the read, not the appends), measured in alternation.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.progress import Progress
from sqlalchemy import create_engine, insert, update

from engram.bench._harness import (
    Latency,
    ServerProcess,
    echo_baseline,
    free_port,
    peak_rss_mb,
    process_tree,
    rss_mb,
    sequential,
    tree_rss_mb,
)
from engram.client.artifacts import ArtifactsClient
from services.artifacts.domain.chain import event_hash, sha256_text
from services.artifacts.tables import EventRow, RunRow, SnapshotRow
from services.common.tokens import TokenSigner, ensure_keypair

MB = 1024 * 1024
SNAPSHOT_EVERY = 1000


def _write_source(path: Path, size: int) -> None:
    block = os.urandom(MB)
    with path.open("wb") as handle:
        for offset in range(0, size, MB):
            handle.write(block[: min(MB, size - offset)])


def _raw_copy(source: Path, target: Path) -> float:
    start = time.perf_counter()
    with source.open("rb") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst, MB)
        dst.flush()
        os.fsync(dst.fileno())
    return time.perf_counter() - start


class RssSampler:
    """Peak RSS of a process (and its children), sampled every 20 ms while a transfer runs."""

    def __init__(self, pid: int) -> None:
        self.pids = process_tree(pid)  # walking /proc per sample cost ~1 ms, 5% of a core
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.pids))
            self._stop.wait(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _service(home: Path, name: str, extra: dict[str, str]) -> ServerProcess:
    env = {"ENGRAM_HOME": str(home), "ENGRAM_LOG_LEVEL": "WARNING",
           "ENGRAM_ARTIFACTS_DB_URL": f"sqlite:///{home / name / 'artifacts.db'}", **extra}
    return ServerProcess([sys.executable, "-m", "services.artifacts"], env,
                         port_env="ENGRAM_ARTIFACTS_PORT")


def _transfer(client: ArtifactsClient, source: Path, target: Path, run_id: str,
              pid: int) -> tuple[float, float, float]:
    with RssSampler(pid) as sampler:
        start = time.perf_counter()
        art = client.upload_file(source, run_id=run_id, step_id="bench", name=source.name)
        up = time.perf_counter() - start
        start = time.perf_counter()
        client.download(art.artifact_id, target)
        down = time.perf_counter() - start
    return up, down, sampler.peak


def _seed_log(db_url: str, run_id: str, events: int) -> None:
    """A hash-chained log with a snapshot every 1k events, written in bulk."""
    engine = create_engine(db_url)
    head, base_us = "", time.time_ns() // 1000
    latest = ""
    with engine.begin() as conn:
        rows: list[dict[str, object]] = []
        snaps: list[dict[str, object]] = []
        for seq in range(1, events + 1):
            payload = json.dumps({"i": seq, "tool": "search"}, separators=(",", ":"),
                                 sort_keys=True)
            digest = event_hash(prev_hash=head, run_id=run_id, seq=seq, type="tool.called",
                                payload_json=payload, manifest_id="", artifact_ids=(),
                                agent_id="bench", created_us=base_us + seq)
            rows.append({"run_id": run_id, "seq": seq, "type": "tool.called",
                         "payload_json": payload, "manifest_id": "", "artifact_ids_json": "[]",
                         "created_us": base_us + seq, "agent_id": "bench", "prev_hash": head,
                         "hash": digest, "request_id": None})
            head = digest
            if seq % SNAPSHOT_EVERY == 0:
                state = json.dumps({"upto": seq})
                latest = f"snap_{run_id}_{seq}"
                snaps.append({"snapshot_id": latest, "run_id": run_id, "seq": seq,
                              "state_json": state, "state_hash": sha256_text(state),
                              "manifest_id": "", "artifact_ids_json": "[]",
                              "created_us": base_us + seq})
            if len(rows) >= 5000:
                conn.execute(insert(EventRow), rows)
                rows = []
        if rows:
            conn.execute(insert(EventRow), rows)
        if snaps:
            conn.execute(insert(SnapshotRow), snaps)
        conn.execute(update(RunRow).where(RunRow.run_id == run_id).values(
            event_count=events, head_hash=head, latest_snapshot_id=latest))
    with engine.connect() as conn:  # fold the bulk load into the main file, as a live WAL would
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()


def _interleaved_rehydrate(client: ArtifactsClient, labels: list[str], rounds: int = 300,
                           warmup: int = 20) -> dict[str, Latency]:
    """Both runs measured in alternation, so a noisy moment lands on both figures alike."""
    run_ids = {label: f"bench-rehydrate-{label}" for label in labels}
    samples: dict[str, list[float]] = {label: [] for label in labels}
    for i in range(warmup + rounds):
        for label, rid in run_ids.items():
            start = time.perf_counter()
            client.rehydrate(rid)
            if i >= warmup:
                samples[label].append(time.perf_counter() - start)
    return {label: Latency.of(found) for label, found in samples.items()}


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> MotoServer:
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p",
             str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise RuntimeError("moto_server did not start")

    def __exit__(self, *_exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(20)


def _raw_boto3(endpoint: str, source: Path, target: Path) -> tuple[float, float]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="bench", aws_secret_access_key="bench")
    start = time.perf_counter()
    with source.open("rb") as body:
        s3.put_object(Bucket="bench", Key="raw/object", Body=body)
    up = time.perf_counter() - start
    start = time.perf_counter()
    stream = s3.get_object(Bucket="bench", Key="raw/object")["Body"]
    with target.open("wb") as handle:
        for chunk in stream.iter_chunks(MB):
            handle.write(chunk)
    down = time.perf_counter() - start
    s3.delete_object(Bucket="bench", Key="raw/object")
    return up, down


def _rate(size: int, seconds: float) -> float:
    return round(size / MB / seconds, 1)


def run(scale: float = 1.0, progress: bool = True) -> dict[str, object]:
    file_size = max(16 * MB, int(1024 * MB * scale))
    s3_size = max(16 * MB, int(128 * MB * scale))
    long_log = max(2000, int(100_000 * scale))
    lookups = max(500, int(2000 * scale))
    figures: dict[str, object] = {}
    figures.update(echo_baseline(sequential_calls=lookups, concurrent_calls=2000))
    with tempfile.TemporaryDirectory(prefix="engram-bench-artifacts-") as tmp, Progress(
            disable=not progress, transient=True) as bar:
        home = Path(tmp)
        keys = ensure_keypair(home)
        token = TokenSigner.load(keys.private).issue("bench", "bench", {"agent"})
        task = bar.add_task("raw file copy", total=None)
        source = home / "source.bin"
        _write_source(source, file_size)
        raw_s = min(_raw_copy(source, home / f"copy{i}.bin") for i in range(2))
        for i in range(2):
            (home / f"copy{i}.bin").unlink()
        figures.update(artifact_mb=file_size // MB, raw_copy_mb_s=_rate(file_size, raw_s))

        bar.update(task, description="file:// service")
        with _service(home, "file", {}) as service, \
                ArtifactsClient(service.address, token) as client:
            run_id = client.start_run("bench-transfer").run.run_id
            up, down, peak = _transfer(client, source, home / "back.bin", run_id, service.pid)
            (home / "back.bin").unlink()
            figures.update(upload_mb_s=_rate(file_size, up), download_mb_s=_rate(file_size, down),
                           service_peak_rss_mb_during_transfer=peak)

            bar.update(task, description="metadata lookup")
            small = client.upload(iter([b"lookup"]), run_id=run_id, step_id="bench", name="k")
            latency = sequential(lambda _i: client.get_artifact(small.artifact_id), lookups)
            figures.update(lookup_p50_ms=latency.p50_ms, lookup_p95_ms=latency.p95_ms)

            bar.update(task, description="rehydrate")
            db_url = f"sqlite:///{home / 'file' / 'artifacts.db'}"
            runs = {"1k": 1000, "long": long_log}
            for label, events in runs.items():
                rid = client.start_run(f"bench-rehydrate-{label}").run.run_id
                _seed_log(db_url, rid, events)
                view = client.rehydrate(rid)
                assert view.snapshot.seq == events - events % SNAPSHOT_EVERY
            for label, latency in _interleaved_rehydrate(client, list(runs)).items():
                figures[f"rehydrate_{label}_events"] = runs[label]
                figures[f"rehydrate_{label}_p95_ms"] = latency.p95_ms
            figures["service_rss_mb"] = rss_mb(service.pid)
            figures["service_peak_rss_mb"] = peak_rss_mb(service.pid)

        bar.update(task, description="s3:// via moto")
        s3_source = home / "s3source.bin"
        _write_source(s3_source, s3_size)
        with MotoServer() as moto:
            import boto3

            boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                         aws_access_key_id="bench", aws_secret_access_key="bench"
                         ).create_bucket(Bucket="bench")
            raw_up, raw_down = _raw_boto3(moto.endpoint, s3_source, home / "s3raw.bin")
            extra = {"ENGRAM_ARTIFACTS_BLOB_URL": "s3://bench/engram",
                     "ENGRAM_ARTIFACTS_S3_ENDPOINT_URL": moto.endpoint,
                     "ENGRAM_ARTIFACTS_S3_REGION": "us-east-1",
                     "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
            with _service(home, "s3", extra) as service, \
                    ArtifactsClient(service.address, token) as client:
                run_id = client.start_run("bench-s3").run.run_id
                up, down, peak = _transfer(client, s3_source, home / "s3back.bin", run_id,
                                           service.pid)
        figures.update(s3_artifact_mb=s3_size // MB, s3_raw_put_mb_s=_rate(s3_size, raw_up),
                       s3_raw_get_mb_s=_rate(s3_size, raw_down),
                       s3_upload_mb_s=_rate(s3_size, up), s3_download_mb_s=_rate(s3_size, down),
                       s3_service_peak_rss_mb=peak)
    raw = float(figures["raw_copy_mb_s"])  # type: ignore[arg-type]
    ratios = {
        "upload_vs_raw_copy": float(figures["upload_mb_s"]) / raw,  # type: ignore[arg-type]
        "download_vs_raw_copy": float(figures["download_mb_s"]) / raw,  # type: ignore[arg-type]
        "s3_upload_vs_raw_put": float(figures["s3_upload_mb_s"])  # type: ignore[arg-type]
        / float(figures["s3_raw_put_mb_s"]),  # type: ignore[arg-type]
        "s3_download_vs_raw_get": float(figures["s3_download_mb_s"])  # type: ignore[arg-type]
        / float(figures["s3_raw_get_mb_s"]),  # type: ignore[arg-type]
        "lookup_p50_vs_echo": float(figures["lookup_p50_ms"])  # type: ignore[arg-type]
        / float(figures["echo_p50_ms"]),  # type: ignore[arg-type]
        "rehydrate_p95_long_vs_1k": float(figures["rehydrate_long_p95_ms"])  # type: ignore[arg-type]
        / float(figures["rehydrate_1k_p95_ms"]),  # type: ignore[arg-type]
    }
    figures.update({k: round(v, 3) for k, v in ratios.items()})
    peak_rss = max(float(figures["service_peak_rss_mb_during_transfer"]),  # type: ignore[arg-type]
                   float(figures["s3_service_peak_rss_mb"]))  # type: ignore[arg-type]
    figures["targets"] = {
        "upload >= 70% raw copy": ratios["upload_vs_raw_copy"] >= 0.7,
        "download >= 70% raw copy": ratios["download_vs_raw_copy"] >= 0.7,
        "service rss <= 150 MB during transfer": peak_rss <= 150,
        "s3 upload >= 70% raw boto3 put": ratios["s3_upload_vs_raw_put"] >= 0.7,
        "s3 download >= 70% raw boto3 get": ratios["s3_download_vs_raw_get"] >= 0.7,
        "lookup p50 <= 2x echo p50": ratios["lookup_p50_vs_echo"] <= 2.0,
        "rehydrate p95 independent of log length (<= 1.5x)":
            ratios["rehydrate_p95_long_vs_1k"] <= 1.5,
    }
    return figures


__all__ = ["run"]
