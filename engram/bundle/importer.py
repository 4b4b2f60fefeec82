"""``engram import-bundle``: a verified bundle into another instance, through its public RPCs.

Order: the whole bundle is verified first (every member's SHA-256 against the manifest, the
manifest against its digest); nothing is sent before that passes. Then governance state: the
fleet's rules (CreateRule with a request id derived from the original rule id, so a re-run
finds them), the tiers an operator pinned (SetTier, only where the target differs), so a
suspended agent stays suspended, the gate decisions (ImportDecisions: imported entries in
this witness chain, so the records reconcile with `engram verify --gate`) and the erasures
(ImportErasures, each then carried out here, so a copy an earlier import brought is erased,
and at the end every erasure governance here holds that could list what the import created);
then erased records' tombstones (ImportTombstones), domains
(UpsertDomain), records (ImportRecords, in batches, each record re-hashed by the shard, all or
nothing per batch), runs (ImportRun), their artifacts with their bytes (ImportArtifact), their
manifests, evidence, events and snapshots (ImportRunItems, in batches; the artifacts service
re-hashes every one), and each run's iteration log (ImportIterations: summaries with their
hashes, and the details the origin still kept). Every step is idempotent: an identical item
already stored is left alone, so running the import again, or again after an interruption,
finishes what is missing and changes nothing else. Parts this version does not import are
reported by name and row count.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby, islice
from typing import TYPE_CHECKING, Any

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.bundle.export import KINDS, Clients, Progress
from engram.bundle.format import (
    CHUNK,
    BundleError,
    BundleReader,
    Manifest,
    blob_path,
    iteration_row,
    parse_row,
)
from engram.client.governance import TIER_NAMES
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb

if TYPE_CHECKING:  # it needs the server extra (the shard's record hashing); only with it
    from engram.bundle.reissue import Reissue

IMPORTED = ("rules", "trust", "decisions", "erasures", "tombstones", "domains", "records",
            "runs", "artifacts", "manifests", "evidence", "events", "snapshots", "iterations")
"""The parts an import writes; the others are named as not imported."""
BATCH = 500
BATCH_BYTES = 3 * 1024 * 1024
"""A batch stays under the servers' 4 MiB request limit."""
ERASURE_ITEMS_PER_CALL = 10_000
"""Governance takes at most this many erasure items in one ImportErasures call (all of one
erasure's fit: it lists at most as many); at ~110 bytes an item, under BATCH_BYTES too."""
ERASURE_PAGE = 100
"""Erasures read a page at a time from this governance (one lists up to 10,000 items)."""
_CARRIED_OUT: tuple[tuple[tuple[str, ...], frozenset[str], str], ...] = (
    (("records",), frozenset({"record", "summary"}), "shard"),
    (("runs", "artifacts", "manifests", "evidence", "events", "snapshots"),
     frozenset({"run", "event", "snapshot", "manifest", "evidence"}), "artifacts"),
    (("iterations",), frozenset({"iterations", "iteration"}), "compactor"),
)
"""Which service carries out an erasure listing these item kinds, and the bundle parts whose
import can bring back what it lists (the shard's first: a record erasure is carried out
before the records come)."""
RUN_ITEMS = (("manifests", apb.Manifest), ("evidence", apb.Evidence), ("events", apb.Event),
             ("snapshots", apb.Snapshot))
"""The parts ImportRunItems carries, in the order their references need: an event names
manifests and artifacts, a snapshot an event's seq."""


@dataclass
class ImportReport:
    manifest: Manifest
    created: dict[str, int] = field(default_factory=dict)
    already_present: dict[str, int] = field(default_factory=dict)
    not_imported: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of each step (verifying the bundle, then each part)."""
    reissued: int = 0
    """Format-1 records and tombstones given new ids (``--reissue-ids``)."""


class Importer:
    """Loads a bundle into the fleet of the clients' token (which must be the bundle's)."""

    def __init__(self, clients: Clients, progress: Progress | None = None, *,
                 reissue: Reissue | None = None) -> None:
        self.clients = clients
        self.progress: Progress = progress or (lambda kind, rows, nbytes: None)
        self.reissue = reissue
        """With it, format-1 records and tombstones land re-addressed (``--reissue-ids``)."""

    def run(self, reader: BundleReader, expect_digest: str = "") -> ImportReport:
        began = time.perf_counter()
        # The digest is compared as soon as the manifest is read: a bundle that is not the one
        # expected is refused before gigabytes of it are hashed.
        manifest = reader.verify(lambda n: self.progress("verifying", 0, n), expect_digest)
        fleet = self.clients.shard.status().fleet_id
        if fleet != manifest.fleet_id:
            raise BundleError(f"the bundle holds fleet {manifest.fleet_id!r} and the token "
                              f"belongs to fleet {fleet!r}; import with a token of fleet "
                              f"{manifest.fleet_id!r}; nothing was imported")
        report = ImportReport(manifest=manifest)
        report.seconds["verify"] = round(time.perf_counter() - began, 3)
        if self.reissue is not None:
            if manifest.run_id:
                raise BundleError(
                    f"--reissue-ids needs a bundle of the whole fleet; this one holds run "
                    f"{manifest.run_id!r} only, and names records of other runs it cannot "
                    "rename; nothing was imported")
            began = time.perf_counter()
            self.progress("re-addressing", 0, 0)
            self.reissue.plan(reader)
            report.reissued = len(self.reissue.ids) + len(self.reissue.runs.manifests)
            report.seconds["re-addressing"] = round(time.perf_counter() - began, 3)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("rules", lambda: self._rules(reader, report, fleet)),
            ("trust", lambda: self._trust(reader, report, fleet)),
            ("decisions", lambda: self._decisions(reader, report)),
            ("erasures", lambda: self._erasures(reader, report)),
            ("tombstones", lambda: self._tombstones(reader, report)),
            ("domains", lambda: self._domains(reader, report)),
            ("records", lambda: self._records(reader, report)),
            ("runs", lambda: self._runs(reader, report)),
            ("artifacts", lambda: self._artifacts(reader, report)),
            *[(kind, lambda kind=kind, message=message:
               self._run_items(reader, report, kind, message)) for kind, message in RUN_ITEMS],
            ("iterations", lambda: self._iterations(reader, report)),
            # Again, every kind, now that the bundle's items are here: an erasure the origin
            # recorded but had not carried out yet (an interrupted forget) erases them, and so
            # does one this instance holds that the bundle, made before it, does not.
            ("erasures carried out", lambda: self._carry_out_here(reader, report)),
        ]
        for name, step in steps:
            began = time.perf_counter()
            step()
            report.seconds[name] = round(time.perf_counter() - began, 3)
        report.not_imported = {kind: manifest.rows(kind) for kind in KINDS
                               if kind not in IMPORTED and manifest.rows(kind)}
        return report

    def _rules(self, reader: BundleReader, report: ImportReport, fleet: str) -> None:
        """Each rule again, as the importer's act in this governance's witness chain (a new
        rule id, author and time); the request id makes a re-run return the same rule."""
        created = same = 0
        present = {_rule_body(r) for r in self.clients.governance.rules(page_size=1000)}
        for row in reader.rows("rules"):
            rule = parse_row(row, gpb.Rule(), "rules")
            key = hashlib.sha256(f"{fleet}\x1f{rule.rule_id}".encode()).hexdigest()[:40]
            if _rule_body(rule) in present:  # the same rule is already in force here
                same += 1
                continue
            for name in ("rule_id", "created_by", "create_time", "fleet_id"):
                rule.ClearField(name)
            reply = self.clients.governance.add_rule(rule, request_id=f"bundle-rule-{key}")
            created += reply.created
            same += not reply.created
            self.progress("rules", 1, 0)
        report.created["rules"], report.already_present["rules"] = created, same

    def _trust(self, reader: BundleReader, report: ImportReport, fleet: str) -> None:
        """Tiers an operator pinned (a suspension, a promotion) are set again; scores the
        accumulator moved are not carried (they follow this instance's outcomes)."""
        pinned = (row for row in reader.rows("trust") if row.get("pinned"))
        changed = same = 0
        while chunk := list(islice(pinned, 100)):  # a chunk at a time: the part may be huge
            wanted = [parse_row(row, gpb.AgentTrust(), "trust") for row in chunk]
            for trust in wanted:  # checked before this chunk sets any
                if trust.tier not in TIER_NAMES:
                    known = ", ".join(f"{v} ({n})" for v, n in sorted(TIER_NAMES.items()))
                    raise BundleError(f"trust of agent {trust.agent_id!r} holds tier "
                                      f"{trust.tier}, not one of {known}")
            current = {t.agent_id: t for t in self.clients.governance.trusts(
                fleet, [t.agent_id for t in wanted])}
            for trust in wanted:
                now = current.get(trust.agent_id)
                if now is not None and now.pinned and now.tier == trust.tier:
                    same += 1
                    continue
                self.clients.governance.set_tier(trust.agent_id, TIER_NAMES[trust.tier],
                                                 reason="pinned at the bundle's origin")
                changed += 1
                self.progress("trust", 1, 0)
        report.created["trust"], report.already_present["trust"] = changed, same

    def _decisions(self, reader: BundleReader, report: ImportReport) -> None:
        """The gate decisions that admitted the records, appended to this governance's witness
        chain as imported entries, so `engram verify --gate` reconciles the records here."""
        self._batched(reader, report, "decisions", gpb.GateDecision,
                      self.clients.governance.import_decisions,
                      rewrite=self.reissue.decision if self.reissue else None)

    def _erasures(self, reader: BundleReader, report: ImportReport) -> None:
        """The fleet's erasures, chained here as imported entries; their records are then
        erased here (a copy an earlier import brought), before the tombstones come. Runs and
        iteration logs are erased after the bundle's own runs are in (the last step)."""
        self._batched(reader, report, "erasures", gpb.Erasure,
                      self.clients.governance.import_erasures,
                      most_items=ERASURE_ITEMS_PER_CALL, items=lambda e: len(e.items),
                      rewrite=self.reissue.erasure if self.reissue else None)
        self._carry_out(reader, runs=False)

    def _carry_out(self, reader: BundleReader, *, runs: bool) -> set[str]:
        """Each erasure carried out here, as `engram forget --resume` does (twice erases
        nothing): its records, and with ``runs`` its runs and iteration logs. An imported
        erasure leaves a run's tombstone here even where the run never was. Returns their ids."""
        kinds = _CARRIED_OUT if runs else _CARRIED_OUT[:1]
        carried: set[str] = set()
        for row in reader.rows("erasures"):
            erasure = parse_row(row, gpb.Erasure(), "erasures")
            self._carry_out_one(erasure, kinds)
            carried.add(erasure.erasure_id)
        return carried

    def _carry_out_here(self, reader: BundleReader, report: ImportReport) -> None:
        """The bundle's erasures, then every other erasure this governance holds for the
        fleet that could list what this import created. A bundle made before an erasure
        recorded here (or brought by another bundle) holds items it lists that this instance
        never held, so nothing here erased them: a record, or an event of a run first seen
        now. Carrying an erasure out again erases nothing it erased before."""
        bundled = self._carry_out(reader, runs=True)
        kinds = [(parts, erased, service) for parts, erased, service in _CARRIED_OUT
                 if any(report.created.get(part) for part in parts)]
        if not kinds:
            return
        for erasure in self.clients.governance.erasures(page_size=ERASURE_PAGE):
            if erasure.erasure_id not in bundled:
                self._carry_out_one(erasure, kinds)
                self.progress("erasures carried out", 1, 0)

    def _carry_out_one(self, erasure: gpb.Erasure,
                       kinds: Sequence[tuple[tuple[str, ...], frozenset[str], str]]) -> None:
        listed = {item.kind for item in erasure.items}
        for _, erased, service in kinds:
            if not listed & erased:
                continue
            if service == "shard":
                self.clients.shard.forget(erasure_id=erasure.erasure_id)
            elif service == "artifacts":
                self.clients.artifacts.forget_runs(erasure.erasure_id)
            else:
                self.clients.compactor.forget_iterations(erasure.erasure_id)

    def _tombstones(self, reader: BundleReader, report: ImportReport) -> None:
        """Erased records' tombstones, so an erased record stays erased here: ImportRecords
        refuses an id with a tombstone. The shard checks each against its erasure above."""
        self._batched(reader, report, "tombstones", spb.RecordTombstone,
                      self.clients.shard.import_tombstones,
                      rewrite=self.reissue.tombstone if self.reissue else None)

    def _domains(self, reader: BundleReader, report: ImportReport) -> None:
        present = {d.name: d for d in self.clients.shard.domains()}
        created = same = 0
        for row in reader.rows("domains"):
            domain = parse_row(row, spb.Domain(), "domains")
            old = present.get(domain.name)
            if old is not None and (old.display_name, old.description, list(old.keywords)) == (
                    domain.display_name, domain.description, list(domain.keywords)):
                same += 1
                continue
            reply = self.clients.shard.upsert_domain(
                domain.name, display_name=domain.display_name, description=domain.description,
                keywords=list(domain.keywords))
            created += reply.created
            same += not reply.created
            self.progress("domains", 1, 0)
        report.created["domains"], report.already_present["domains"] = created, same

    def _records(self, reader: BundleReader, report: ImportReport) -> None:
        self._batched(reader, report, "records", spb.Record, self.clients.shard.import_records,
                      rewrite=self.reissue.record if self.reissue else None)

    def _runs(self, reader: BundleReader, report: ImportReport) -> None:
        """Each run as it was at the origin (author, status, times); its events follow."""
        created = present = 0
        for row in reader.rows("runs"):
            reply = self.clients.artifacts.import_run(parse_row(row, apb.Run(), "runs"))
            created += reply.created
            present += not reply.created
            self.progress("runs", 1, 0)
        report.created["runs"], report.already_present["runs"] = created, present

    def _artifacts(self, reader: BundleReader, report: ImportReport) -> None:
        """Each artifact with its bytes, streamed from the bundle's blob (verified above); the
        service hashes them again before anything is stored."""
        created = present = 0
        for row in reader.rows("artifacts"):
            artifact = parse_row(row, apb.Artifact(), "artifacts")
            try:
                path = blob_path(artifact.hash)
            except ValueError:
                raise BundleError(f"artifact {artifact.artifact_id}'s hash {artifact.hash[:80]!r} "
                                  "is not a lowercase hex SHA-256; stopped before it") from None
            if not reader.has(path):
                raise BundleError(f"artifact {artifact.artifact_id}'s bytes (blobs/"
                                  f"{artifact.hash}) are not in the bundle; stopped before it")
            with reader.blob(artifact.hash) as blob:
                reply = self.clients.artifacts.import_artifact(
                    artifact, _counted(iter(lambda: blob.read(CHUNK), b""), self.progress))
            created += reply.created
            present += not reply.created
            self.progress("artifacts", 1, 0)
        report.created["artifacts"], report.already_present["artifacts"] = created, present

    def _run_items(self, reader: BundleReader, report: ImportReport, kind: str,
                   message: type[Any]) -> None:
        rewrite = None
        if self.reissue is not None and kind != "evidence":
            rewrite = getattr(self.reissue.runs, kind.removesuffix("s"))
        self._batched(reader, report, kind, message,
                      lambda batch: self.clients.artifacts.import_run_items(**{kind: batch}),
                      rewrite=rewrite)

    def _batched(self, reader: BundleReader, report: ImportReport, kind: str,
                 message: type[Any], send: Callable[[list[Any]], Any], *,
                 most_items: int = 0, items: Callable[[Any], int] | None = None,
                 rewrite: Callable[[Any], Any] | None = None) -> None:
        """A part's rows, parsed (and passed through ``rewrite``), in batches of at most
        ``BATCH`` rows and ``BATCH_BYTES`` (with ``items``, at most ``most_items`` of what it
        counts instead of bytes: an erasure's items), each sent with ``send``; counts what it
        created and what was there already."""
        created = present = 0
        rows = reader.messages(kind, message)
        if rewrite is not None:
            rows = (rewrite(row) for row in rows)
        for batch in (_batches(rows, BATCH, most_items, items) if items is not None
                      else _batches(rows, BATCH, BATCH_BYTES)):
            reply = send(batch)
            created += reply.created
            present += reply.already_present
            self.progress(kind, len(batch), sum(m.ByteSize() for m in batch))
        report.created[kind], report.already_present[kind] = created, present

    def _iterations(self, reader: BundleReader, report: ImportReport) -> None:
        """Each run's iteration log in order, summaries with their hashes and the details the
        origin still kept; the compactor checks every line extends the stored log."""
        created = present = 0
        rows = (iteration_row(row) for row in reader.rows("iterations"))
        if self.reissue is not None:
            rows = ((run_id, self.reissue.lines.iteration(run_id, item))
                    for run_id, item in rows)
        for run_id, group in groupby(rows, key=lambda pair: pair[0]):
            for batch in _batches((item for _, item in group), BATCH, BATCH_BYTES):
                reply = self.clients.compactor.import_iterations(run_id, batch)
                created += reply.created
                present += reply.already_present
                self.progress("iterations", len(batch), sum(m.ByteSize() for m in batch))
        report.created["iterations"] = created
        report.already_present["iterations"] = present


def _counted(chunks: Iterator[bytes], progress: Progress) -> Iterator[bytes]:
    for chunk in chunks:
        progress("blobs", 0, len(chunk))
        yield chunk


def _rule_body(rule: gpb.Rule) -> bytes:
    """What a rule does, without who made it, when, or its id."""
    body = gpb.Rule()
    body.CopyFrom(rule)
    for name in ("rule_id", "created_by", "create_time", "fleet_id"):
        body.ClearField(name)
    return body.SerializeToString(deterministic=True)


def _batches(items: Iterator[Any], most: int, most_bytes: int,
             size: Callable[[Any], int] = lambda m: m.ByteSize() + 8) -> Iterator[list[Any]]:
    batch: list[Any] = []
    total = 0
    for item in items:
        grows = size(item)
        if batch and (len(batch) >= most or total + grows > most_bytes):
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += grows
    if batch:
        yield batch
