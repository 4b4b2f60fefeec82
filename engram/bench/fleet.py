"""`engram bench fleet`: a simulated fleet of agents loading all four services at once.

N agents, each with its own token, spread over F fleets, each a thread doing
closed-loop operations (the next starts when the last has answered) for a
fixed time. Each operation is drawn from the ratios with a per-agent seeded
RNG:

- ``write``: CreateRecord into the agent's current run (a durable, gated write);
- ``search``: SearchRecords over the agent's fleet (hybrid: lexical when the
  shard has no embedder);
- ``snapshot``: SnapshotForRun with verify (every record re-hashed) of the
  agent's current run; a snapshot holding fewer records than the agent had
  acknowledged in that run counts as the error ``SNAPSHOT_SHORT``;
- ``iteration``: RecordIteration on the compactor (the run's next iteration);
- ``artifact``: a small streamed upload (1-4 KiB) to the artifacts service.

Each agent starts a run (artifacts StartRun, the ``start_run`` row) when it
begins and again after every ``RUN_LENGTH`` operations, so a snapshot's size
does not grow with the duration. Failed calls are counted by gRPC status code
and never stop the run (the agent backs off, 50 ms doubling up to 1 s, while
its calls keep failing); latencies are those of the calls that succeeded.

By default the benchmark starts its own stack (governance, shard gated by it,
artifacts, compactor; each its own process on 127.0.0.1, SQLite or a fresh
Postgres database per service, under a temporary directory) and removes it
afterwards. With ``start=False`` it loads the stack ``engram up`` runs, found
through ``$ENGRAM_HOME/endpoints.json``, minting agent tokens with that home's
signing key; what the agents write stays there. A raw gRPC echo is measured in
the same run, with as many callers in flight as there are agents.
"""

from __future__ import annotations

import os
import random
import resource
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from engram.bench._corpus import Corpus, pseudo_words
from engram.bench._harness import (
    BenchUnavailable,
    Latency,
    ServerProcess,
    echo_baseline,
    process_tree,
)
from engram.client import (
    ArtifactsClient,
    ClientSettings,
    CompactorClient,
    EngramRpcError,
    ShardClient,
)
from engram.compactor.v1 import compactor_service_pb2 as cpb

if TYPE_CHECKING:
    import sqlalchemy

OPERATIONS = ("write", "search", "snapshot", "iteration", "artifact")
"""The operations an agent chooses from, in the order they are reported."""
DEFAULT_RATIOS: dict[str, float] = {
    "write": 0.5, "search": 0.3, "snapshot": 0.05, "iteration": 0.1, "artifact": 0.05,
}
RUN_LENGTH = 200
"""Operations an agent does in one run before it starts the next."""
START_RUN = "start_run"
BACKOFF_S, BACKOFF_MAX_S = 0.05, 1.0
"""After a failed call an agent waits 50 ms, doubling while failures continue, up to 1 s."""
SNAPSHOT_SHORT = "SNAPSHOT_SHORT"
POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SERVICES = ("governance", "artifacts", "shard", "compactor")
_CALL_TIMEOUT_S = 30.0
_VOCABULARY = pseudo_words()


@dataclass(frozen=True)
class FleetParams:
    """What `engram bench fleet` was asked for; echoed into the figures."""

    agents: int = 16
    duration_s: float = 30.0
    ratios: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIOS))
    fleets: int = 1
    seed: int = 1
    start: bool = True
    home: Path | None = None
    """The `engram up` home to load when ``start`` is False (default: $ENGRAM_HOME)."""
    db: str = "sqlite"
    postgres_url: str = POSTGRES_ADMIN_URL
    embedder: str = "none"

    def check(self) -> None:
        if self.agents < 1:
            raise ValueError(f"agents must be at least 1, got {self.agents}")
        if not 0 < self.duration_s <= 24 * 3600:
            raise ValueError(f"duration must be 0..86400 seconds, got {self.duration_s}")
        if not 1 <= self.fleets <= self.agents:
            raise ValueError(f"fleets must be 1..agents ({self.agents}), got {self.fleets}")
        if self.db not in ("sqlite", "postgres"):
            raise ValueError(f"db must be sqlite or postgres, got {self.db!r}")
        operation_weights(self.ratios)


def operation_weights(ratios: Mapping[str, float]) -> dict[str, float]:
    """The ratios as shares summing to 1, in OPERATIONS order, zeros left out."""
    unknown = set(ratios) - set(OPERATIONS)
    if unknown:
        raise ValueError(f"unknown operation(s) {sorted(unknown)}; choose from {OPERATIONS}")
    negative = {op: r for op, r in ratios.items() if r < 0}
    if negative:
        raise ValueError(f"ratios must not be negative: {negative}")
    total = sum(ratios.values())
    if total <= 0:
        raise ValueError("at least one ratio must be above 0")
    return {op: ratios[op] / total for op in OPERATIONS if ratios.get(op, 0) > 0}


class OperationPicker:
    """Draws operations in the given proportions from a seeded RNG (same seed, same sequence)."""

    def __init__(self, weights: Mapping[str, float], rng: random.Random) -> None:
        self.operations = list(weights)
        self._cumulative = list(accumulate(weights.values()))
        self._rng = rng

    def pick(self) -> str:
        return self._rng.choices(self.operations, cum_weights=self._cumulative)[0]


@dataclass
class Tally:
    """One agent's results (merged after the run; each agent writes only its own)."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, Counter[str]] = field(default_factory=dict)

    def ok(self, operation: str, seconds: float) -> None:
        self.samples.setdefault(operation, []).append(seconds)

    def failed(self, operation: str, code: str) -> None:
        self.errors.setdefault(operation, Counter())[code] += 1

    def attempts(self) -> tuple[int, int]:
        """(succeeded, failed) so far; read by the progress bar while the agent runs."""
        ok = sum(len(s) for s in list(self.samples.values()))
        failed = sum(sum(c.values()) for c in list(self.errors.values()))
        return ok, failed

    def merge(self, other: Tally) -> None:
        for operation, samples in other.samples.items():
            self.samples.setdefault(operation, []).extend(samples)
        for operation, codes in other.errors.items():
            self.errors.setdefault(operation, Counter()).update(codes)


def summarize(tally: Tally, elapsed_s: float) -> dict[str, object]:
    """Rates, percentiles and errors of a merged tally over ``elapsed_s`` seconds."""
    ordered = [op for op in (*OPERATIONS, START_RUN) if op in tally.samples or op in tally.errors]
    operations: dict[str, dict[str, object]] = {}
    latency: dict[str, dict[str, float]] = {}
    errors: Counter[str] = Counter()
    for op in ordered:
        samples, failed = tally.samples.get(op, []), tally.errors.get(op, Counter())
        errors.update(failed)
        operations[op] = {
            "ok": len(samples),
            "failed": sum(failed.values()),
            "ops_per_s": round(len(samples) / elapsed_s, 1),
            "errors": dict(failed.most_common()),
        }
        if samples:
            found = Latency.of(samples)
            latency[op] = {"p50": found.p50_ms, "p95": found.p95_ms, "p99": found.p99_ms}
    ok = sum(len(s) for s in tally.samples.values())
    failed_total = sum(errors.values())
    return {
        "elapsed_s": round(elapsed_s, 2),
        "ops": ok,
        "failed": failed_total,
        "ops_per_s": round(ok / elapsed_s, 1),
        "ops_per_s_by_operation": {op: operations[op]["ops_per_s"] for op in ordered},
        "latency_ms": latency,
        "errors": dict(errors.most_common()),
        "operations": operations,
    }


# -- the stack ---------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    addresses: dict[str, str]
    mint: Callable[[str, str], str]
    """mint(agent_id, fleet_id): an agent token this stack accepts."""
    description: str
    pids: dict[str, int] = field(default_factory=dict)
    """Each service's process, when the benchmark started it (its CPU time is reported)."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children (e.g. the shard's embedder)."""
    ticks = 0
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _signer_mint(private_key: Path) -> Callable[[str, str], str]:
    from services.common.tokens import TokenSigner

    signer = TokenSigner.load(private_key)
    return lambda agent, fleet: signer.issue(agent, fleet, {"agent"})


def _serving(address: str) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def running_stack(home: Path | None) -> Stack:
    """The stack `engram up` runs from ``home`` (default $ENGRAM_HOME), if every service answers."""
    from services.common.tokens import key_paths

    environ = dict(os.environ)
    if home is not None:
        environ["ENGRAM_HOME"] = str(home)
    settings = ClientSettings(environ)
    addresses = {name: str(getattr(settings, f"{name}_addr")) for name in SERVICES}
    down = [f"{name} at {address}" for name, address in addresses.items()
            if not _serving(address)]
    if down:
        raise BenchUnavailable(
            f"no running stack to load: {', '.join(down)} not SERVING (start one with "
            f"`engram up`, point --home at its ENGRAM_HOME, or drop --no-start)")
    private = key_paths(settings.home).private
    if not private.exists():
        raise BenchUnavailable(f"agent tokens are minted with the deployment's signing key; "
                               f"{private} does not exist (is --home the home `engram up` used?)")
    return Stack(addresses, _signer_mint(private), f"running stack of {settings.home}")


@contextmanager
def _postgres_databases(admin_url: str, names: tuple[str, ...]) -> Iterator[dict[str, str]]:
    """A fresh database per service, dropped afterwards."""
    import sqlalchemy

    suffix = uuid.uuid4().hex[:8]
    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    databases = {name: f"engram_fleet_{name}_{suffix}" for name in names}
    created: list[str] = []
    try:
        with admin.connect() as conn:
            for database in databases.values():
                conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
                created.append(database)
    except sqlalchemy.exc.OperationalError as error:
        _drop(admin, created)
        raise BenchUnavailable(f"--db postgres needs PostgreSQL at {admin_url}: "
                               f"{str(error).splitlines()[0]}") from None
    try:
        yield {name: admin.url.set(database=database).render_as_string(hide_password=False)
               for name, database in databases.items()}
    finally:
        _drop(admin, created)


def _drop(admin: sqlalchemy.Engine, databases: list[str]) -> None:
    try:
        with admin.connect() as conn:
            for database in databases:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        admin.dispose()


@contextmanager
def started_stack(params: FleetParams) -> Iterator[Stack]:
    """All four services, each its own process on 127.0.0.1, the shard gated by governance."""
    from services.common.auth import service_principal
    from services.common.tokens import TokenSigner, ensure_keypair, write_token_file

    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="engram-bench-fleet-")))
        keys = ensure_keypair(home)
        signer = TokenSigner.load(keys.private)
        for name in SERVICES:
            write_token_file(home / "auth" / f"{name}.token",
                             signer.issue(*service_principal(name)))
        if params.db == "postgres":
            urls = stack.enter_context(_postgres_databases(params.postgres_url, SERVICES))
        else:
            urls = {name: f"sqlite:///{home / name / f'{name}.db'}" for name in SERVICES}
        addresses: dict[str, str] = {}
        pids: dict[str, int] = {}

        def service(name: str, extra: dict[str, str]) -> None:
            (home / name).mkdir(exist_ok=True)
            prefix = f"ENGRAM_{name.upper()}_"
            env = {"ENGRAM_HOME": str(home), "ENGRAM_LOG_LEVEL": "WARNING",
                   f"{prefix}DB_URL": urls[name],
                   f"{prefix}SERVICE_TOKEN_FILE": str(home / "auth" / f"{name}.token"), **extra}
            process = ServerProcess([sys.executable, "-m", f"services.{name}"], env,
                                    port_env=f"{prefix}PORT", timeout=120,
                                    log_path=home / name / "service.log")
            addresses[name] = stack.enter_context(process).address
            pids[name] = process.pid

        service("governance", {})
        service("artifacts", {"ENGRAM_ARTIFACTS_BLOB_URL": (home / "artifacts" / "blobs").as_uri()})
        service("shard", {"ENGRAM_SHARD_GOVERNANCE_ADDR": addresses["governance"],
                          "ENGRAM_SHARD_EMBEDDER": params.embedder})
        service("compactor", {"ENGRAM_COMPACTOR_SHARD_ADDR": addresses["shard"],
                              "ENGRAM_COMPACTOR_BLOB_URL": (home / "compactor" / "blobs").as_uri()})
        yield Stack(addresses, lambda agent, fleet: signer.issue(agent, fleet, {"agent"}),
                    f"started stack on {params.db}", pids)


# -- the agents ----------------------------------------------------------------


class Agent:
    """One simulated agent: its own token and channels, closed-loop operations until the end."""

    def __init__(self, index: int, fleet: str, token: str, stack: Stack,
                 weights: Mapping[str, float], seed: int) -> None:
        self.name = f"fleet-agent-{index:03d}"
        self.fleet = fleet
        self.rng = random.Random(seed * 1_000_003 + index)
        self.picker = OperationPicker(weights, self.rng)
        self.corpus = Corpus(_VOCABULARY, seed=seed * 1_000_003 + index)
        self.tally = Tally()
        self.shard = ShardClient(stack.addresses["shard"], token, timeout=_CALL_TIMEOUT_S)
        self.compactor = CompactorClient(stack.addresses["compactor"], token,
                                         timeout=_CALL_TIMEOUT_S)
        self.artifacts = ArtifactsClient(stack.addresses["artifacts"], token,
                                         timeout=_CALL_TIMEOUT_S,
                                         stream_timeout=_CALL_TIMEOUT_S)
        self.run_id = ""
        self.run_ops = 0
        self.acknowledged = 0
        self.serial = 0
        self._actions: dict[str, Callable[[], None]] = {
            "write": self.write, "search": self.search, "snapshot": self.snapshot,
            "iteration": self.iteration, "artifact": self.artifact,
        }

    def loop(self, deadline: float, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set() and time.monotonic() < deadline:
            if not self.run_id or self.run_ops >= RUN_LENGTH:
                ok = self._timed(START_RUN, self.start_run)
            else:
                self.run_ops += 1
                ok = self._timed(self.picker.pick(), None)
            failures = 0 if ok else failures + 1
            if failures:
                # As a retrying client would: a stack that is down is not hammered in a spin.
                stop.wait(min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (failures - 1)))

    def _timed(self, operation: str, action: Callable[[], None] | None) -> bool:
        start = time.perf_counter()
        try:
            (action or self._actions[operation])()
        except EngramRpcError as error:
            self.tally.failed(operation, error.code.name)
        except _SnapshotShort:
            self.tally.failed(operation, SNAPSHOT_SHORT)
        except Exception as error:  # counted, never fatal: the run must finish and report
            self.tally.failed(operation, type(error).__name__)
        else:
            self.tally.ok(operation, time.perf_counter() - start)
            return True
        return False

    def start_run(self) -> None:
        self.run_id = ""
        self.run_id = self.artifacts.start_run().run.run_id
        self.run_ops = self.acknowledged = 0

    def write(self) -> None:
        self.serial += 1
        self.shard.add(f"{self.corpus.sentence(self.serial)} [{self.name}]", run_id=self.run_id,
                       importance=round(self.rng.random(), 3),
                       request_id=f"{self.name}-{self.run_id}-{self.serial}")
        self.acknowledged += 1

    def search(self) -> None:
        self.shard.search(" ".join(self.corpus.words(3)), limit=10)

    def snapshot(self) -> None:
        expected = self.acknowledged
        found = sum(1 for _ in self.shard.snapshot(self.run_id, verify=True))
        if found < expected:
            raise _SnapshotShort(f"{self.run_id}: {found} records, {expected} acknowledged")

    def iteration(self) -> None:
        now = time.time()
        item = cpb.IterationInput(
            iteration=0, plan_digest=f"{self.rng.getrandbits(128):032x}",
            parent_digest=f"{self.rng.getrandbits(128):032x}",
            start_time=Timestamp(seconds=int(now) - 30), end_time=Timestamp(seconds=int(now)),
            files_touched=self.rng.randint(0, 20), net_add=self.rng.randint(0, 400),
            net_del=self.rng.randint(0, 200), risk_score=round(self.rng.random(), 3),
            status="success",
            detail_json=f'{{"note": "{" ".join(self.corpus.words(40))}"}}')
        self.compactor.record(self.run_id, item, request_id=uuid.uuid4().hex)

    def artifact(self) -> None:
        self.serial += 1
        body = self.rng.randbytes(self.rng.randint(1024, 4096))
        self.artifacts.upload(iter([body]), run_id=self.run_id, step_id="step",
                              name=f"out-{self.serial}.bin", size_bytes=len(body))

    def close(self) -> None:
        for client in (self.shard, self.compactor, self.artifacts):
            client.close()


class _SnapshotShort(Exception):
    """A run's snapshot lacks records the agent had been told were stored."""


def _drive(agents: list[Agent], duration_s: float, bar: Progress) -> float:
    """Run every agent for ``duration_s``; the seconds from the start to the last answer."""
    stop = threading.Event()
    start = time.monotonic()
    deadline = start + duration_s
    threads = [threading.Thread(target=a.loop, args=(deadline, stop), name=a.name, daemon=True)
               for a in agents]
    task = bar.add_task("load", total=duration_s, status="")
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            ok, failed = map(sum, zip(*(a.tally.attempts() for a in agents), strict=True))
            bar.update(task, completed=min(duration_s, now - start),
                       status=f"{ok:,} ok  {failed:,} failed  "
                              f"{ok / max(now - start, 1e-9):,.0f} ops/s")
            time.sleep(0.25)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join()
    return time.monotonic() - start


def run(scale: float = 1.0, progress: bool = True,
        params: FleetParams | None = None) -> dict[str, object]:
    """The figures of one fleet run (``scale`` multiplies the default duration)."""
    params = params or FleetParams(duration_s=FleetParams.duration_s * scale)
    params.check()
    weights = operation_weights(params.ratios)
    with ExitStack() as scope:
        bar = scope.enter_context(Progress(
            TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"), disable=not progress, transient=True))
        setup = bar.add_task("starting the services" if params.start
                             else "checking the running stack", total=None, status="")
        stack = (scope.enter_context(started_stack(params)) if params.start
                 else running_stack(params.home))
        bar.update(setup, description="raw gRPC echo")
        echo = echo_baseline(sequential_calls=2000, concurrent_calls=max(4000, 200 * params.agents),
                             in_flight=params.agents)
        bar.update(setup, description=f"{params.agents} agents connecting")
        agents = [Agent(i, f"bench-fleet-{i % params.fleets}",
                        stack.mint(f"fleet-agent-{i:03d}", f"bench-fleet-{i % params.fleets}"),
                        stack, weights, params.seed) for i in range(params.agents)]
        for agent in agents:
            scope.callback(agent.close)
        bar.remove_task(setup)
        began, load_before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.getloadavg()
        cpu_before = {name: cpu_seconds(pid) for name, pid in stack.pids.items()}
        own_before = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = _drive(agents, params.duration_s, bar)
        own_after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = {name: round(cpu_seconds(pid) - cpu_before[name], 1)
               for name, pid in stack.pids.items()}
        cpu["load generator"] = round(own_after.ru_utime + own_after.ru_stime
                                      - own_before.ru_utime - own_before.ru_stime, 1)
        load_after = os.getloadavg()
        tally = Tally()
        for agent in agents:
            tally.merge(agent.tally)
    figures: dict[str, object] = {
        "agents": params.agents,
        "duration_s": params.duration_s,
        "fleets": params.fleets,
        "ratios": {op: round(share, 4) for op, share in weights.items()},
        "seed": params.seed,
        "stack": stack.description,
        "db": params.db if params.start else "as running",
        "embedder": params.embedder if params.start else "as running",
    }
    figures.update(summarize(tally, elapsed))
    figures["echo"] = {"p50_ms": echo["echo_p50_ms"], "p95_ms": echo["echo_p95_ms"],
                       "calls_per_s": echo["echo_calls_per_s"], "in_flight": params.agents}
    figures["ops_per_s_vs_echo"] = round(
        float(figures["ops_per_s"]) / echo["echo_calls_per_s"], 3)  # type: ignore[arg-type]
    # Other work on the host moves every figure here: say how busy it was.
    figures["machine"] = {
        "started_at": began, "nproc": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
    }
    # Where the CPU went during the load (services only when this run started them).
    figures["cpu_s"] = cpu
    return figures


def summary_tables(figures: Mapping[str, object]) -> list[Table]:
    """The run as a person reads it: per-operation rates and latencies, errors, the echo."""
    operations: Mapping[str, Mapping[str, object]] = figures["operations"]  # type: ignore[assignment]
    latency: Mapping[str, Mapping[str, float]] = figures["latency_ms"]  # type: ignore[assignment]
    table = Table(title=f"{figures['agents']} agents, {figures['fleets']} fleet(s), "
                        f"{figures['elapsed_s']} s, {figures['stack']}")
    for column in ("operation", "ok", "failed", "ops/s", "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    for op, row in operations.items():
        lat = latency.get(op, {})
        table.add_row(op, f"{row['ok']:,}", f"{row['failed']:,}", f"{row['ops_per_s']}",
                      *(f"{lat[p]:.2f}" if p in lat else "-" for p in ("p50", "p95", "p99")))
    machine: Mapping[str, list[float]] = figures["machine"]  # type: ignore[assignment]
    table.caption = (f"{machine['nproc']} cores, load average {machine['load_average_before'][0]}"
                     f" -> {machine['load_average_after'][0]}")
    table.add_section()
    table.add_row("all", f"{figures['ops']:,}", f"{figures['failed']:,}",
                  f"{figures['ops_per_s']}", "", "", "")
    errors: Mapping[str, int] = figures["errors"]  # type: ignore[assignment]
    error_table = Table(title="errors by status code", min_width=32)
    error_table.add_column("code")
    error_table.add_column("count", justify="right")
    for code, count in errors.items():
        error_table.add_row(code, f"{count:,}")
    if not errors:
        error_table.add_row("none", "0")
    echo: Mapping[str, object] = figures["echo"]  # type: ignore[assignment]
    echo_table = Table(title="raw gRPC echo, same run")
    for column in ("p50 ms", "p95 ms", "calls/s", "in flight", "fleet ops/s vs echo"):
        echo_table.add_column(column, justify="right")
    echo_table.add_row(f"{echo['p50_ms']}", f"{echo['p95_ms']}", f"{echo['calls_per_s']:,}",
                       f"{echo['in_flight']}", f"{figures['ops_per_s_vs_echo']}")
    cpu: Mapping[str, float] = figures["cpu_s"]  # type: ignore[assignment]
    cpu_table = Table(title=f"CPU seconds during the {figures['elapsed_s']} s of load",
                      min_width=40)
    for name in cpu:
        cpu_table.add_column(name, justify="right")
    cpu_table.add_row(*(f"{seconds}" for seconds in cpu.values()))
    return [table, error_table, echo_table, cpu_table]


__all__ = ["DEFAULT_RATIOS", "OPERATIONS", "FleetParams", "OperationPicker", "Tally",
           "operation_weights", "run", "summarize", "summary_tables"]
