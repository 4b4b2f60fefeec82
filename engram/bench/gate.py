"""`engram bench gate`: gated writes and trust-ranked search against a raw gRPC echo, same run.

Starts governance and two shards, each its own process on 127.0.0.1 with its
own SQLite store: one shard gated by governance (every write decided and
recorded in the witness chain; search ranked by trust), one without
governance, loaded with the same records. Figures: gated single-write latency
(target p50 <= 6x echo p50), gated writes with 64 in flight (target >= 30% of
echo calls/s; both issue 16's targets), search p95 with and without trust
ranking (target: at most 0.5 ms apart), the bare DecideWrites RPC (sequential
and 64 in flight, where group commit shares one transaction), and the cached
multiplier lookup.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.progress import Progress

from engram.bench._harness import Latency, ServerProcess, concurrent, echo_baseline, sequential
from engram.client import ShardClient, record_input
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from services.common.auth import service_principal
from services.common.tokens import TokenSigner, ensure_keypair, write_token_file
from services.shard.governance_gate import connect_governance

_WORDS = [
    "agent", "memory", "lesson", "decision", "project", "retry", "timeout", "cache", "index",
    "query", "latency", "replica", "leader", "snapshot", "ledger", "artifact", "governance",
    "trust", "rule", "gate", "witness", "chain", "deploy", "rollback", "canary", "incident",
    "metric", "trace", "budget", "review", "release", "schema",
]
_AUTHORS = [f"agent-{i}" for i in range(8)]


def _sentence(rng: random.Random, serial: int) -> str:
    return f"{' '.join(rng.choices(_WORDS, k=rng.randint(8, 16)))} (note {serial})"


def run(scale: float = 1.0, progress: bool = True) -> dict[str, object]:
    single = max(200, int(1000 * scale))
    in_flight_total = max(1000, int(5000 * scale))
    corpus = max(500, int(5000 * scale))
    searches = max(200, int(1000 * scale))
    figures: dict[str, object] = {}
    figures.update(echo_baseline(sequential_calls=single, concurrent_calls=in_flight_total))
    with tempfile.TemporaryDirectory(prefix="engram-bench-gate-") as tmp, Progress(
        disable=not progress, transient=True
    ) as bar:
        home = Path(tmp)
        signer = TokenSigner.load(ensure_keypair(home).private)
        service_token = home / "shard-service.token"
        write_token_file(service_token, signer.issue(*service_principal("shard")))
        tokens = {a: signer.issue(a, "bench", {"agent"}) for a in _AUTHORS}
        base = {"ENGRAM_HOME": str(home), "ENGRAM_LOG_LEVEL": "WARNING",
                # Searches here are lexical; background embedding would only add noise.
                "ENGRAM_SHARD_EMBEDDER": "none"}
        task = bar.add_task("starting governance and shards", total=None)
        governance = ServerProcess(
            [sys.executable, "-m", "services.governance"],
            {**base, "ENGRAM_GOVERNANCE_DB_URL": f"sqlite:///{home / 'governance.db'}"},
            port_env="ENGRAM_GOVERNANCE_PORT")
        with governance:
            gated = ServerProcess([sys.executable, "-m", "services.shard"], {
                **base, "ENGRAM_SHARD_DB_URL": f"sqlite:///{home / 'gated.db'}",
                "ENGRAM_SHARD_GOVERNANCE_ADDR": governance.address,
                "ENGRAM_SHARD_SERVICE_TOKEN_FILE": str(service_token)},
                port_env="ENGRAM_SHARD_PORT")
            plain = ServerProcess([sys.executable, "-m", "services.shard"], {
                **base, "ENGRAM_SHARD_DB_URL": f"sqlite:///{home / 'plain.db'}",
                "ENGRAM_SHARD_ALLOW_UNGATED": "true"},
                port_env="ENGRAM_SHARD_PORT")
            with gated, plain:
                _measure(figures, bar, task, governance.address, gated.address, plain.address,
                         tokens, service_token, single, in_flight_total, corpus, searches)
    _ratios(figures)
    return figures


def _measure(figures: dict[str, object], bar: Progress, task: object, gov_addr: str,
             gated_addr: str, plain_addr: str, tokens: dict[str, str], service_token: Path,
             single: int, in_flight_total: int, corpus: int, searches: int) -> None:
    rng = random.Random(11)
    writer = ShardClient(gated_addr, tokens[_AUTHORS[0]])
    bar.update(task, description="gated single writes")  # type: ignore[arg-type]
    latency = sequential(lambda i: writer.add(_sentence(rng, 1_000_000 + i)), single)
    figures["gated_write_p50_ms"], figures["gated_write_p95_ms"] = latency.p50_ms, latency.p95_ms
    plain_writer = ShardClient(plain_addr, tokens[_AUTHORS[0]])
    latency = sequential(lambda i: plain_writer.add(_sentence(rng, 2_000_000 + i)), single)
    figures["ungated_write_p50_ms"] = latency.p50_ms

    bar.update(task, description="gated writes, 64 in flight")  # type: ignore[arg-type]
    figures["gated_write_calls_per_s"] = round(concurrent(
        lambda i: writer.add(_sentence(random.Random(i), 3_000_000 + i)), in_flight_total, 64), 1)

    bar.update(task, description="DecideWrites alone")  # type: ignore[arg-type]
    gov = GovernanceClient(gov_addr, service_token.read_text().strip())
    decide = sequential(lambda i: gov.decide("bench", "agent-x", uuid.uuid4().hex, [
        gpb.WriteCandidate(record_id=f"r{i}", content_hash=f"h{i}",
                           content=_sentence(rng, i))]), single)
    figures["decide_rpc_p50_ms"] = decide.p50_ms
    figures["decide_rpc_calls_per_s"] = round(concurrent(
        lambda i: gov.decide("bench", f"agent-{i % 8}", uuid.uuid4().hex, [
            gpb.WriteCandidate(record_id=f"c{i}", content_hash=f"c{i}",
                               content=_sentence(random.Random(i), i))]),
        in_flight_total, 64), 1)

    bar.update(task, description="loading both shards for search")  # type: ignore[arg-type]
    for start in range(0, corpus, 100):
        author = _AUTHORS[(start // 100) % len(_AUTHORS)]
        batch = [record_input(_sentence(random.Random(n), 4_000_000 + n))
                 for n in range(start, min(corpus, start + 100))]
        for address in (gated_addr, plain_addr):
            with ShardClient(address, tokens[author]) as client:
                client.add_many(batch, request_id=f"load-{start}")
    reader_gated = ShardClient(gated_addr, tokens[_AUTHORS[1]])
    reader_plain = ShardClient(plain_addr, tokens[_AUTHORS[1]])
    queries = [" ".join(random.Random(q).choices(_WORDS, k=3)) for q in range(searches)]
    bar.update(task, description="search with and without trust")  # type: ignore[arg-type]
    with_trust = sequential(lambda i: reader_gated.search(queries[i % len(queries)],
                                                          mode="lexical"), searches)
    without = sequential(lambda i: reader_plain.search(queries[i % len(queries)],
                                                       mode="lexical"), searches)
    figures["search_trust_p95_ms"], figures["search_plain_p95_ms"] = (with_trust.p95_ms,
                                                                      without.p95_ms)
    figures["search_trust_p50_ms"], figures["search_plain_p50_ms"] = (with_trust.p50_ms,
                                                                      without.p50_ms)
    _, trust = connect_governance(gov_addr, service_token)
    trust.multipliers("bench", _AUTHORS)
    samples = []
    for _ in range(2000):
        start_t = time.perf_counter()
        trust.multipliers("bench", _AUTHORS)
        samples.append(time.perf_counter() - start_t)
    figures["cached_multipliers_p95_us"] = round(Latency.of(samples).p95_ms * 1000, 2)
    for opened in (writer, plain_writer, gov, reader_gated, reader_plain):
        opened.close()


def _ratios(f: dict[str, object]) -> None:
    def num(key: str) -> float:
        value = f[key]
        assert isinstance(value, int | float)
        return float(value)

    f["gated_write_p50_over_echo_p50"] = round(num("gated_write_p50_ms") / num("echo_p50_ms"), 2)
    f["gate_overhead_p50_ms"] = round(num("gated_write_p50_ms") - num("ungated_write_p50_ms"), 3)
    f["gated_write_rate_over_echo_rate"] = round(
        num("gated_write_calls_per_s") / num("echo_calls_per_s"), 3)
    f["search_trust_p95_overhead_ms"] = round(
        num("search_trust_p95_ms") - num("search_plain_p95_ms"), 3)
    f["target_write_p50_le_6x_echo"] = f["gated_write_p50_over_echo_p50"] <= 6  # type: ignore[operator]
    f["target_write_rate_ge_30pct_echo"] = f["gated_write_rate_over_echo_rate"] >= 0.3  # type: ignore[operator]
    f["target_trust_search_p95_within_0_5ms"] = f["search_trust_p95_overhead_ms"] <= 0.5  # type: ignore[operator]
