"""``engram export``: one fleet's state, read through the services' public RPCs, into a bundle.

Nothing reads a service's store behind its back: every row comes from a List/Read RPC with
the caller's token (which must belong to the fleet exported), as protobuf's JSON with proto
field names. Rows are staged in a SQLite file (unlinked once open) keyed by a sort key that
depends on the content only (a record's create time and id, an event's run and seq, ...) and
written out in that order, so the same state exported from SQLite or Postgres, or before and
after an import, gives the same bytes, and the memory used does not grow with the fleet.

Fields a service recomputes on use (a domain's record count, importance and update time, a
run's event count) are left out: they are not the fleet's content.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.bundle.format import BundleError, BundleWriter, Manifest
from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient
from engram.client.governance import GovernanceClient
from engram.client.shard import ShardClient
from engram.compactor.v1 import compactor_service_pb2 as cpb

PAGE = 1000
KINDS = ("domains", "records", "rules", "trust", "decisions", "erasures", "tombstones", "runs",
         "artifacts", "events", "snapshots", "evidence", "manifests", "iterations")
"""Every part an export writes, in the order an import reads them."""
VOLATILE = {
    "domains": ("record_count", "importance", "update_time", "incoming_links"),
    "runs": ("event_count", "head_hash", "latest_snapshot_id"),
    "trust": ("update_time",),
    "decisions": ("chain_seq",),  # where this governance's chain holds it, not the decision
    "erasures": ("chain_seq", "imported"),  # where it was recorded, not the erasure
}
"""Fields recomputed by a service on use, not carried."""


class Progress(Protocol):
    def __call__(self, kind: str, rows: int, nbytes: int) -> None: ...


def proto_row(message: Message, kind: str = "") -> dict[str, Any]:
    """A message as a bundle row: proto field names, defaults left out (stable either way)."""
    row = MessageToDict(message, preserving_proto_field_name=True)
    for name in VOLATILE.get(kind, ()):
        row.pop(name, None)
    return row


@dataclass
class Clients:
    shard: ShardClient
    governance: GovernanceClient
    artifacts: ArtifactsClient
    compactor: CompactorClient

    def close(self) -> None:
        for client in (self.shard, self.governance, self.artifacts, self.compactor):
            client.close()


@dataclass
class ExportReport:
    manifest: Manifest
    rows: dict[str, int] = field(default_factory=dict)
    blob_bytes: int = 0
    bundle_bytes: int = 0


class _Stage:
    """Rows waiting to be written in their sort order, on disk: ``<out>.stage``, unlinked as
    soon as SQLite has it open, so nothing holding the fleet's rows is left behind however
    the export ends (a kill included); one left by a kill in between is removed first."""

    def __init__(self, out: Path) -> None:
        path = out.with_name(out.name + ".stage")
        path.unlink(missing_ok=True)
        self.db = sqlite3.connect(path)
        try:
            self.db.execute("PRAGMA journal_mode=OFF")
            self.db.execute("PRAGMA synchronous=OFF")
            self.db.execute("CREATE TABLE rows (kind TEXT, sort_key TEXT, row TEXT, "
                            "PRIMARY KEY (kind, sort_key)) WITHOUT ROWID")
        finally:
            path.unlink(missing_ok=True)  # the open file lives on until close

    def put(self, kind: str, key: str, row: dict[str, Any]) -> None:
        # A repeated key (an item listed twice across pages) keeps one copy.
        self.db.execute("INSERT OR REPLACE INTO rows VALUES (?, ?, ?)",
                        (kind, key, json.dumps(row)))

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        found = self.db.execute("SELECT row FROM rows WHERE kind = ? AND sort_key = ?",
                                (kind, key)).fetchone()
        return None if found is None else dict(json.loads(found[0]))

    def rows(self, kind: str) -> Iterator[dict[str, Any]]:
        cursor = self.db.execute("SELECT row FROM rows WHERE kind = ? ORDER BY sort_key",
                                 (kind,))
        for (text,) in cursor:
            yield json.loads(text)

    def close(self) -> None:
        self.db.close()


def _ignore_missing(items: Iterable[Any]) -> Iterator[Any]:
    """A list of a run one service has never heard of is empty, not a failure."""
    try:
        yield from items
    except EngramRpcError as error:
        if error.code.name != "NOT_FOUND":
            raise


class Exporter:
    """Reads the fleet of the clients' token (and only it) into a bundle."""

    def __init__(self, clients: Clients, progress: Progress | None = None) -> None:
        self.clients = clients
        self.progress: Progress = progress or (lambda kind, rows, nbytes: None)

    def fleet_id(self) -> str:
        return self.clients.shard.status().fleet_id

    def export(self, out: Path, fleet_id: str, run_id: str | None = None) -> ExportReport:
        actual = self.fleet_id()
        if fleet_id != actual:
            raise BundleError(f"the token belongs to fleet {actual!r}, not {fleet_id!r}: export "
                              f"with a token of fleet {fleet_id!r} (engram token create "
                              f"--fleet {fleet_id} --role admin)")
        report = ExportReport(manifest=Manifest(fleet_id=fleet_id))
        stage = _Stage(Path(out))
        try:
            with BundleWriter(out, fleet_id, run_id or "") as bundle:
                self._stage_all(stage, run_id)
                for kind in KINDS:
                    if kind == "artifacts":
                        report.blob_bytes = self._write_artifacts(stage, bundle)
                        report.rows[kind] = bundle.manifest.rows(kind)
                        continue
                    with bundle.part(kind) as part:
                        for row in stage.rows(kind):
                            part.write(row)
                        report.rows[kind] = part.rows
            report.manifest = bundle.manifest
            report.bundle_bytes = Path(out).stat().st_size
        finally:
            stage.close()
        return report

    def _stage_all(self, stage: _Stage, run_id: str | None) -> None:
        c = self.clients
        runs: set[str] = set()
        agents: set[str] = set()
        gate_ids: set[str] = set()
        for record in c.shard.list(run_id=run_id, page_size=PAGE):
            stage.put("records", f"{record.create_time.ToNanoseconds():020d}/{record.id}",
                      proto_row(record))
            runs.add(record.run_id)
            agents.add(record.agent_id)
            if run_id is not None and record.gate_decision_id:
                gate_ids.add(record.gate_decision_id)
            self.progress("records", 1, record.ByteSize())
        # After the records: a domain created while they were listed, holding one of them, is
        # in the bundle too (an import refuses a record of an unknown domain).
        for domain in c.shard.domains():
            stage.put("domains", domain.name, proto_row(domain, "domains"))
        for rule in c.governance.rules(page_size=PAGE):
            stage.put("rules", rule.rule_id, proto_row(rule))
        # A fleet export carries every gate decision; a run export those of its records.
        decisions = (c.governance.decisions(page_size=PAGE) if run_id is None else
                     (d for ids in _chunks(sorted(gate_ids), 100)
                      for d in c.governance.decisions_by_id(ids)))
        for decision in decisions:
            stage.put("decisions", decision.decision_id, proto_row(decision, "decisions"))
            agents.add(decision.agent_id)
        named = self._stage_tombstones(stage, run_id)
        fleet = self.fleet_id()
        for ids in _chunks(sorted(agents - {""}), 100):
            for trust in c.governance.trusts(fleet, ids):
                stage.put("trust", trust.agent_id, proto_row(trust, "trust"))
        for run in c.artifacts.list_runs(page_size=PAGE):
            if run_id is None or run.run_id == run_id:
                stage.put("runs", run.run_id, proto_row(run, "runs"))
                runs.add(run.run_id)
        for run_name in sorted(runs - {""}):
            named |= self._stage_run(stage, run_name)
        # After the runs: the erasures their events' and snapshots' tombstones name are known.
        self._stage_erasures(stage, run_id, named)
        if run_id is None:
            for evidence in c.artifacts.paginate(
                    c.artifacts.stub.ListEvidence, apb.ListEvidenceRequest(page_size=PAGE),
                    lambda reply: reply.evidence):
                stage.put("evidence", evidence.evidence_id, proto_row(evidence))
            # The manifests built for no run (a run's own came with the run).
            for manifest in c.artifacts.paginate(
                    c.artifacts.stub.ListManifests, apb.ListManifestsRequest(page_size=PAGE),
                    lambda reply: reply.manifests):
                if not manifest.run_id:
                    stage.put("manifests", manifest.manifest_id, proto_row(manifest))

    def _stage_tombstones(self, stage: _Stage, run_id: str | None) -> set[str]:
        """The erased records' tombstones (of the run, for a run export); the ids of the
        erasures that erased them."""
        named: set[str] = set()
        for tombstone in self.clients.shard.tombstones(page_size=PAGE):
            if run_id is None or tombstone.run_id == run_id:
                stage.put("tombstones", tombstone.id, proto_row(tombstone))
                named.add(tombstone.erasure_id)
        return named

    def _stage_erasures(self, stage: _Stage, run_id: str | None, named: set[str]) -> None:
        """The erasures: every erasure of the fleet for a fleet export; for a run export those
        ``named`` by what it carries erased (its records' tombstones, and its events and
        snapshots erased in place, which travel as tombstones naming their erasure: the target
        takes such a tombstone only when it holds that erasure). On the target they keep what
        was erased erased, and say what was erased, when and by whom."""
        for erasure in self.clients.governance.erasures(page_size=PAGE):
            if run_id is None or erasure.erasure_id in named:
                key = f"{erasure.create_time.ToMilliseconds():020d}/{erasure.erasure_id}"
                stage.put("erasures", key, proto_row(erasure, "erasures"))

    def _stage_run(self, stage: _Stage, run: str) -> set[str]:
        """The run's artifacts, events, snapshots, manifests and iteration log; the ids of the
        erasures that erased its events and snapshots in place (their tombstones name them)."""
        c = self.clients
        named: set[str] = set()
        for artifact in _ignore_missing(c.artifacts.list_artifacts(run, page_size=PAGE)):
            stage.put("artifacts", artifact.artifact_id, proto_row(artifact))
        for event in _ignore_missing(c.artifacts.list_events(run, page_size=PAGE)):
            stage.put("events", f"{run}/{event.seq:020d}", proto_row(event))
            if event.erasure_id:
                named.add(event.erasure_id)
        for snapshot in _ignore_missing(c.artifacts.list_snapshots(run, page_size=PAGE)):
            stage.put("snapshots", f"{run}/{snapshot.seq:020d}/{snapshot.snapshot_id}",
                      proto_row(snapshot))
            if snapshot.erasure_id:
                named.add(snapshot.erasure_id)
        for manifest in _ignore_missing(c.artifacts.paginate(
                c.artifacts.stub.ListManifests,
                apb.ListManifestsRequest(run_id=run, page_size=PAGE),
                lambda reply: reply.manifests)):
            stage.put("manifests", manifest.manifest_id, proto_row(manifest))
        last = 0
        for summary in _ignore_missing(c.compactor.summaries(run, page_size=PAGE)):
            stage.put("iterations", f"{run}/{summary.iteration:020d}",
                      {"run_id": run, **proto_row(summary)})
            last = summary.iteration
            if summary.erasure_id:  # erased in place: the run bundle carries its erasure
                named.add(summary.erasure_id)
        for iteration, (detail, guardrails) in self._iteration_details(run, last).items():
            key = f"{run}/{iteration:020d}"
            row = stage.get("iterations", key)
            if row is not None:
                stage.put("iterations", key,
                          {**row, "detail_json": detail, "guardrails_json": guardrails})
        return named

    def _iteration_details(self, run: str, last: int) -> dict[int, tuple[str, str]]:
        """The full details the compactor still keeps for ``run``: its hot ring, then each cold
        snapshot, found newest first (a reconstruction below the hot ring names the nearest
        snapshot and returns its detail): one call a snapshot, never one an iteration."""
        compactor = self.clients.compactor
        details = {hot.summary.iteration: (hot.detail_json, hot.guardrails_json)
                   for hot in _ignore_missing(compactor.recent(run, page_size=PAGE))}
        below = min(details, default=last + 1) - 1
        while below >= 1:
            try:
                view = compactor.reconstruct(run, below)
            except EngramRpcError as error:
                if error.reason != "TRAIL_TOO_LONG":
                    raise
                # A snapshot pinned long before: its own detail is all this needs of it (the
                # trail between goes with the iterations' summaries).
                below = int(error.metadata["base_iteration"])
                continue
            if view.summary.erasure_id:  # erased in place: no detail, nor its snapshot
                below -= 1
                continue
            if view.source == cpb.DETAIL_SOURCE_BASE_SNAPSHOT:
                below = view.base_iteration
            elif view.source != cpb.DETAIL_SOURCE_COLD_SNAPSHOT:
                break  # no snapshot at or before it: only summaries from here down
            details[below] = (view.detail_json, view.guardrails_json)
            below -= 1
        return details

    def _write_artifacts(self, stage: _Stage, bundle: BundleWriter) -> int:
        """The artifact rows, and each distinct blob once, streamed from ReadArtifact (which
        re-hashes it server-side) and checked again against its SHA-256 on the way in."""
        blob_bytes = 0
        with bundle.part("artifacts") as part:
            for row in stage.rows("artifacts"):
                part.write(row)
                sha = row.get("hash", "")
                if sha and not bundle.has_blob(sha):
                    _, chunks = self.clients.artifacts.read(row["artifact_id"])
                    member = bundle.add_blob(sha, _counted(chunks, self.progress))
                    blob_bytes += member.size
        return blob_bytes


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _counted(chunks: Iterator[bytes], progress: Progress) -> Iterator[bytes]:
    for chunk in chunks:
        progress("blobs", 0, len(chunk))
        yield chunk


def open_clients(settings: Any) -> Clients:
    """The four clients from CLI settings (``engram.client.ClientSettings``)."""
    token = settings.resolve_token()
    tls = settings.tls()
    timeout = settings.timeout_seconds
    return Clients(
        shard=ShardClient(settings.shard_addr, token, **tls, timeout=timeout),
        governance=GovernanceClient(settings.governance_addr, token, **tls, timeout=timeout),
        artifacts=ArtifactsClient(settings.artifacts_addr, token, **tls, timeout=timeout),
        compactor=CompactorClient(settings.compactor_addr, token, **tls, timeout=timeout),
    )

