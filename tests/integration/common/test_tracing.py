"""One trace per write: client -> shard -> governance and back, with parent links; JSON logs
carry the trace id. Runs in a child process, since a tracer provider is set once per process
(and, set, would turn tracing on for every later test)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import io, json, logging, sys
    from pathlib import Path
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    from engram.client import ShardClient
    from services.common.logging_setup import JsonFormatter
    from services.common.tokens import TokenSigner, ensure_keypair, write_token_file
    from services.governance.server import build_governance_server
    from services.governance.settings import GovernanceSettings
    from services.shard.governance_gate import connect_governance
    from services.shard.server import build_shard_server
    from services.shard.settings import ShardSettings

    home = Path(sys.argv[1])
    keys = ensure_keypair(home)
    signer = TokenSigner.load(keys.private)
    governance = build_governance_server(GovernanceSettings(
        home=home, port=0, db_url=f"sqlite:///{home / 'g.db'}")).start()
    write_token_file(home / "svc.token", signer.issue("svc-shard", "system", {"service"}))
    gate, trust = connect_governance(governance.address, home / "svc.token")
    shard, _ = build_shard_server(ShardSettings(home=home, port=0, embedder="none",
                                                db_url=f"sqlite:///{home / 's.db'}"),
                                  gate=gate, trust=trust)
    shard.start()
    with ShardClient(shard.address, signer.issue("agent-t", "fleet-t", {"agent"})) as client:
        exporter.clear()
        client.add("a traced fact")
    single = list(exporter.get_finished_spans())

    # Writes arriving while a gate call is in flight are carried together by one call.
    import threading, time
    from services.governance.service import GovernanceService
    decide_group = GovernanceService._decide_group
    def slow_group(service, requests):
        time.sleep(0.2)
        return decide_group(service, requests)
    GovernanceService._decide_group = slow_group
    exporter.clear()
    clients = [ShardClient(shard.address, signer.issue(f"agent-{n}", "fleet-t", {"agent"}))
               for n in range(6)]
    start = threading.Barrier(len(clients))
    def write(n):
        start.wait()
        clients[n].add(f"coalesced fact {n}")
    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    coalesced = list(exporter.get_finished_spans())
    shard.stop(0)
    governance.stop(0)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("test"))
    with trace.get_tracer("test").start_as_current_span("logged") as span:
        record = logging.makeLogRecord({"msg": "inside a span", "levelname": "INFO"})
        line = json.loads(handler.format(record))
    def described(spans):
        return [{"name": s.name, "kind": s.kind.name,
                 "trace": format(s.context.trace_id, "032x"),
                 "id": format(s.context.span_id, "016x"),
                 "parent": format(s.parent.span_id, "016x") if s.parent else None,
                 "links": [format(link.context.span_id, "016x") for link in s.links]}
                for s in spans]
    print(json.dumps({
        "spans": described(single), "coalesced": described(coalesced),
        "log": line, "log_span": format(span.get_span_context().trace_id, "032x")}))
''')


def test_a_write_is_one_trace_from_client_through_shard_into_governance(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                            text=True, timeout=120, check=False,
                            cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    spans = {(s["name"].rsplit("/", 1)[-1], s["kind"]): s for s in report["spans"]}
    client = spans[("CreateRecord", "CLIENT")]
    server = spans[("CreateRecord", "SERVER")]
    gate = spans[("governance gate", "INTERNAL")]
    gate_client = spans[("DecideWrites", "CLIENT")]
    gate_server = spans[("DecideWrites", "SERVER")]
    assert len({client["trace"], server["trace"], gate_client["trace"],
                gate_server["trace"]}) == 1, report["spans"]
    assert client["parent"] is None
    assert server["parent"] == client["id"]
    assert gate["parent"] == server["id"]
    assert gate_client["parent"] == gate["id"]
    assert gate_server["parent"] == gate_client["id"]
    assert report["log"]["trace_id"] == report["log_span"]

    # Coalesced writes: each write's trace has its gate span; the call that carried others'
    # requests is a span linked to each of their gate spans, its RPC a child of it.
    spans = report["coalesced"]
    gates = {s["trace"]: s for s in spans if s["name"] == "governance gate"}
    writes = [s for s in spans if s["name"].endswith("CreateRecord") and s["kind"] == "SERVER"]
    assert len(writes) == 6 and all(w["trace"] in gates for w in writes), spans
    carriers = [s for s in spans if s["name"] == "governance gate: coalesced call"]
    assert carriers, "no call carried another write's request"
    linked = {link for carrier in carriers for link in carrier["links"]}
    assert linked <= {g["id"] for g in gates.values()}
    batch_rpcs = [s for s in spans if s["name"].endswith("DecideWriteBatches")
                  and s["kind"] == "CLIENT"]
    assert batch_rpcs and all(any(r["parent"] == c["id"] for c in carriers)
                              for r in batch_rpcs), spans
    # Every write's gate span is either the parent of its own call or linked from a carrier.
    own_calls = {s["parent"] for s in spans if s["name"].endswith("DecideWrites")
                 and s["kind"] == "CLIENT"}
    assert all(g["id"] in linked | own_calls for g in gates.values()), spans
