"""gRPC edge of the artifacts service: protos in, ArtifactsService calls, protos out."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.artifacts.v1 import artifacts_service_pb2_grpc as pb_grpc
from services.artifacts.domain.entities import (
    Artifact,
    ArtifactProblem,
    Event,
    Evidence,
    Manifest,
    Pointer,
    PointerType,
    Run,
    RunStatus,
    Snapshot,
)
from services.artifacts.domain.integrity import ArtifactUpload, UploadEnd
from services.artifacts.erasure import RunEraser
from services.artifacts.imports import RunImports
from services.artifacts.service import ArtifactsService, now_us
from services.common.admission import READ, WRITE, MethodKinds
from services.common.auth import MethodPolicy, current_principal
from services.common.errors import InvalidArgument
from services.common.find_cursor import FindCursor, scan_filters
from services.common.timestamps import time_us

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ArtifactsService"].full_name
_USERS = frozenset({"agent", "admin"})  # no service calls artifacts
_READERS = frozenset({"agent", "admin", "governor"})
MAX_CHUNK_SIZE = 4 * 1024 * 1024


def _m(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


POLICY: MethodPolicy = {
    **{_m(name): _USERS for name in (
        "StartRun", "StopRun", "CreateArtifact", "AppendEvent", "CreateSnapshot",
        "CreateEvidence", "CreateManifest", "ResolvePointer", "Rehydrate")},
    **{_m(name): _READERS for name in (
        "GetRun", "ListRuns", "GetArtifact", "ReadArtifact", "ListArtifacts", "VerifyArtifacts",
        "ListEvents", "ReplayEvents", "GetLatestSnapshot", "ListSnapshots", "GetEvidence",
        "ListEvidence", "GetManifest", "ListManifests")},
    _m("ForgetRuns"): frozenset({"governor", "admin"}),  # erasure: a governance act
    _m("FindRuns"): frozenset({"governor", "admin"}),
    # Imports keep the origin's authors, times and hashes: an admin's act (docs/security.md).
    **{_m(name): frozenset({"admin"}) for name in (
        "ImportRun", "ImportArtifact", "ImportRunItems")},
}
assert set(POLICY) == {
    _m(m.name) for m in pb.DESCRIPTOR.services_by_name["ArtifactsService"].methods
}
KINDS: MethodKinds = {  # which rate limit each RPC counts against
    **{_m(name): WRITE for name in (  # ResolvePointer and Rehydrate may stop a run
        "StartRun", "StopRun", "CreateArtifact", "AppendEvent", "CreateSnapshot",
        "CreateEvidence", "CreateManifest", "ResolvePointer", "Rehydrate", "ForgetRuns",
        "ImportRun", "ImportArtifact", "ImportRunItems")},
    **{_m(name): READ for name in (
        "GetRun", "ListRuns", "GetArtifact", "ReadArtifact", "ListArtifacts", "VerifyArtifacts",
        "ListEvents", "ReplayEvents", "GetLatestSnapshot", "ListSnapshots", "GetEvidence",
        "ListEvidence", "GetManifest", "ListManifests", "FindRuns")},
}
assert set(KINDS) == set(POLICY)

_STATUS_TO_PB = {
    RunStatus.RUNNING: pb.RUN_STATUS_RUNNING,
    RunStatus.SUCCEEDED: pb.RUN_STATUS_SUCCEEDED,
    RunStatus.FAILED: pb.RUN_STATUS_FAILED,
    RunStatus.CANCELLED: pb.RUN_STATUS_CANCELLED,
    RunStatus.SYSTEM_ERROR: pb.RUN_STATUS_SYSTEM_ERROR,
}
_STATUS_FROM_PB = {v: k for k, v in _STATUS_TO_PB.items()}
_POINTER_FROM_PB = {
    pb.POINTER_TYPE_ARTIFACT: PointerType.ARTIFACT,
    pb.POINTER_TYPE_EVIDENCE: PointerType.EVIDENCE,
    pb.POINTER_TYPE_MANIFEST: PointerType.MANIFEST,
}


def _ts(micros: int) -> Timestamp | None:
    if not micros:
        return None
    stamp = Timestamp()
    stamp.FromMicroseconds(micros)
    return stamp


def run_to_proto(run: Run) -> pb.Run:
    return pb.Run(run_id=run.run_id, fleet_id=run.fleet_id, agent_id=run.agent_id,
                  status=_STATUS_TO_PB[run.status], stop_reason=run.stop_reason,
                  create_time=_ts(run.created_us), stop_time=_ts(run.stopped_us),
                  event_count=run.event_count, head_hash=run.head_hash,
                  latest_snapshot_id=run.latest_snapshot_id, metadata_json=run.metadata_json)


def artifact_to_proto(artifact: Artifact) -> pb.Artifact:
    return pb.Artifact(artifact_id=artifact.artifact_id, run_id=artifact.run_id,
                       step_id=artifact.step_id, path=artifact.path, hash=artifact.hash,
                       mime_type=artifact.mime_type, size_bytes=artifact.size_bytes,
                       create_time=_ts(artifact.created_us), metadata_json=artifact.metadata_json)


def event_to_proto(event: Event) -> pb.Event:
    return pb.Event(run_id=event.run_id, seq=event.seq, type=event.type,
                    payload_json=event.payload_json, manifest_id=event.manifest_id,
                    artifact_ids=list(event.artifact_ids), create_time=_ts(event.created_us),
                    prev_hash=event.prev_hash, hash=event.hash, agent_id=event.agent_id,
                    format=event.format, salt=event.salt,
                    payload_commitment=event.payload_commitment, erasure_id=event.erasure_id,
                    erase_time=_ts(event.erased_us), erased_by=event.erased_by)


def snapshot_to_proto(snapshot: Snapshot) -> pb.Snapshot:
    return pb.Snapshot(snapshot_id=snapshot.snapshot_id, run_id=snapshot.run_id,
                       seq=snapshot.seq, state_json=snapshot.state_json,
                       state_hash=snapshot.state_hash, manifest_id=snapshot.manifest_id,
                       artifact_ids=list(snapshot.artifact_ids),
                       create_time=_ts(snapshot.created_us), format=snapshot.format,
                       salt=snapshot.salt, erasure_id=snapshot.erasure_id,
                       erase_time=_ts(snapshot.erased_us), erased_by=snapshot.erased_by)


def evidence_to_proto(evidence: Evidence) -> pb.Evidence:
    return pb.Evidence(evidence_id=evidence.evidence_id, corpus_id=evidence.corpus_id,
                       index_id=evidence.index_id, chunk_id=evidence.chunk_id,
                       span=pb.Span(start=evidence.span_start, end=evidence.span_end),
                       artifact_id=evidence.artifact_id, metadata_json=evidence.metadata_json,
                       create_time=_ts(evidence.created_us))


def manifest_to_proto(manifest: Manifest) -> pb.Manifest:
    return pb.Manifest(manifest_id=manifest.manifest_id, run_id=manifest.run_id,
                       content_json=manifest.content_json, content_hash=manifest.content_hash,
                       create_time=_ts(manifest.created_us), format=manifest.format,
                       salt=manifest.salt)


def _us(stamp: Timestamp) -> int:
    return time_us(stamp, "create_time", reason="INVALID_CREATE_TIME")


def _erase_us(stamp: Timestamp) -> int:
    return time_us(stamp, "erase_time", reason="INVALID_ERASE_TIME")


def run_from_proto(run: pb.Run) -> Run:
    status = _STATUS_FROM_PB.get(run.status)
    if status is None:
        raise InvalidArgument("run.status must be RUNNING, SUCCEEDED, FAILED, CANCELLED or "
                              "SYSTEM_ERROR", reason="INVALID_RUN")
    return Run(run_id=run.run_id, fleet_id=run.fleet_id, agent_id=run.agent_id, status=status,
               stop_reason=run.stop_reason, created_us=_us(run.create_time),
               stopped_us=time_us(run.stop_time, "stop_time", reason="INVALID_CREATE_TIME"),
               event_count=0, head_hash="",
               latest_snapshot_id="", metadata_json=run.metadata_json)


def artifact_from_proto(artifact: pb.Artifact) -> Artifact:
    return Artifact(artifact_id=artifact.artifact_id, run_id=artifact.run_id,
                    step_id=artifact.step_id, path=artifact.path, hash=artifact.hash,
                    mime_type=artifact.mime_type, size_bytes=artifact.size_bytes,
                    created_us=_us(artifact.create_time), metadata_json=artifact.metadata_json)


def event_from_proto(event: pb.Event) -> Event:
    return Event(run_id=event.run_id, seq=event.seq, type=event.type,
                 payload_json=event.payload_json, manifest_id=event.manifest_id,
                 artifact_ids=tuple(event.artifact_ids), created_us=_us(event.create_time),
                 agent_id=event.agent_id, prev_hash=event.prev_hash, hash=event.hash,
                 format=event.format or 1, salt=event.salt,
                 payload_commitment=event.payload_commitment, erasure_id=event.erasure_id,
                 erased_us=_erase_us(event.erase_time), erased_by=event.erased_by)


def snapshot_from_proto(snapshot: pb.Snapshot) -> Snapshot:
    return Snapshot(snapshot_id=snapshot.snapshot_id, run_id=snapshot.run_id, seq=snapshot.seq,
                    state_json=snapshot.state_json, state_hash=snapshot.state_hash,
                    manifest_id=snapshot.manifest_id,
                    artifact_ids=tuple(snapshot.artifact_ids),
                    created_us=_us(snapshot.create_time), format=snapshot.format or 1,
                    salt=snapshot.salt, erasure_id=snapshot.erasure_id,
                    erased_us=_erase_us(snapshot.erase_time), erased_by=snapshot.erased_by)


def evidence_from_proto(evidence: pb.Evidence, fleet_id: str) -> Evidence:
    return Evidence(fleet_id=fleet_id, evidence_id=evidence.evidence_id,
                    corpus_id=evidence.corpus_id, index_id=evidence.index_id,
                    chunk_id=evidence.chunk_id, span_start=evidence.span.start,
                    span_end=evidence.span.end, artifact_id=evidence.artifact_id,
                    metadata_json=evidence.metadata_json, created_us=_us(evidence.create_time))


def manifest_from_proto(manifest: pb.Manifest, fleet_id: str) -> Manifest:
    return Manifest(fleet_id=fleet_id, manifest_id=manifest.manifest_id,
                    run_id=manifest.run_id, content_json=manifest.content_json,
                    content_hash=manifest.content_hash, created_us=_us(manifest.create_time),
                    format=manifest.format, salt=manifest.salt)


def problem_to_proto(problem: ArtifactProblem) -> pb.ArtifactProblem:
    return pb.ArtifactProblem(**problem.__dict__)


def _upload_parts(requests: Iterator[pb.CreateArtifactRequest] |
                  Iterator[pb.ImportArtifactRequest]) -> Iterator[bytes | UploadEnd]:
    """The chunks and the trailer of an upload; a second header or a cancel aborts it.

    A cancelled call may end ``requests`` like a finished one (grpc can see the
    empty read before the cancellation), so completeness is the trailer's to say.
    """
    try:
        for request in requests:
            part = request.WhichOneof("part")
            if part == "chunk":
                yield request.chunk
            elif part == "trailer":
                yield UploadEnd(request.trailer.size_bytes, request.trailer.sha256)
            else:
                raise InvalidArgument("only the first message of an upload carries a header",
                                      reason="UPLOAD_MALFORMED")
    except grpc.RpcError:
        raise InvalidArgument("the client cancelled the upload; nothing was stored",
                              reason="UPLOAD_ABORTED") from None


class ArtifactsServicer(pb_grpc.ArtifactsServiceServicer):
    def __init__(self, service: ArtifactsService, eraser: RunEraser | None = None) -> None:
        self.service = service
        self.eraser = eraser or RunEraser(service, None)
        self.imports = RunImports(service, self.eraser.source)

    # -- runs ---------------------------------------------------------------

    def StartRun(self, request: pb.StartRunRequest,
                 context: grpc.ServicerContext) -> pb.StartRunResponse:
        caller = current_principal()
        run, created = self.service.start_run(caller.fleet_id, caller.agent_id, request.run_id,
                                              request.metadata_json)
        return pb.StartRunResponse(run=run_to_proto(run), created=created)

    def GetRun(self, request: pb.GetRunRequest,
               context: grpc.ServicerContext) -> pb.GetRunResponse:
        run = self.service.get_run(current_principal().fleet_id, request.run_id)
        return pb.GetRunResponse(run=run_to_proto(run))

    def ListRuns(self, request: pb.ListRunsRequest,
                 context: grpc.ServicerContext) -> pb.ListRunsResponse:
        runs, token = self.service.list_runs(current_principal().fleet_id, request.page_token,
                                             request.page_size)
        return pb.ListRunsResponse(runs=[run_to_proto(r) for r in runs], next_page_token=token)

    def StopRun(self, request: pb.StopRunRequest,
                context: grpc.ServicerContext) -> pb.StopRunResponse:
        caller = current_principal()
        status = _STATUS_FROM_PB.get(request.status)
        if status is None:
            raise InvalidArgument("status must be SUCCEEDED, FAILED or CANCELLED")
        run = self.service.stop_run(caller.fleet_id, caller.agent_id, request.run_id, status,
                                    request.reason)
        return pb.StopRunResponse(run=run_to_proto(run))

    def ForgetRuns(self, request: pb.ForgetRunsRequest,
                   context: grpc.ServicerContext) -> pb.ForgetRunsResponse:
        erased, already, in_place, loose = self.eraser.erase(
            current_principal().fleet_id, request.erasure_id, now_us())
        return pb.ForgetRunsResponse(runs=[pb.ForgottenRun(
            run_id=r.run_id, head_hash=r.head_hash, events=r.events, snapshots=r.snapshots,
            artifacts=r.artifacts, manifests=r.manifests, evidence=r.evidence) for r in erased],
            already_erased=already, events_erased=in_place.events,
            snapshots_erased=in_place.snapshots,
            items_already_erased=in_place.already + loose.already,
            manifests_erased=loose.manifests, evidence_erased=loose.evidence)

    def FindRuns(self, request: pb.FindRunsRequest,
                 context: grpc.ServicerContext) -> pb.FindRunsResponse:
        fleet_id = current_principal().fleet_id
        pages, filters = self.service.pages, scan_filters("runs", fleet_id, request.match)
        page = self.eraser.find(
            fleet_id, request.match, request.limit, context.is_active,
            FindCursor.from_key(pages.decode(request.page_token, filters)))
        following = page.following
        return pb.FindRunsResponse(runs=[pb.FoundRun(
            run_id=r.run_id, head_hash=r.head_hash, places=r.places,
            items=[pb.FoundItem(kind=kind, id=item_id, leaf_hash=leaf)
                   for kind, item_id, leaf in r.items],
            whole_run_needed=r.whole_run_needed) for r in page.runs],
            loose_items=[pb.FoundItem(kind=i.kind, id=i.id, leaf_hash=i.leaf_hash,
                                      format=i.format) for i in page.loose],
            more=following is not None,
            next_page_token=pages.encode(following.key(), filters) if following else "")

    def ImportRun(self, request: pb.ImportRunRequest,
                  context: grpc.ServicerContext) -> pb.ImportRunResponse:
        run, created = self.imports.import_run(current_principal().fleet_id,
                                               run_from_proto(request.run))
        return pb.ImportRunResponse(run=run_to_proto(run), created=created)

    def ImportRunItems(self, request: pb.ImportRunItemsRequest,
                       context: grpc.ServicerContext) -> pb.ImportRunItemsResponse:
        fleet_id = current_principal().fleet_id
        counts = self.imports.import_items(
            fleet_id, [manifest_from_proto(m, fleet_id) for m in request.manifests],
            [evidence_from_proto(e, fleet_id) for e in request.evidence],
            [event_from_proto(e) for e in request.events],
            [snapshot_from_proto(s) for s in request.snapshots])
        return pb.ImportRunItemsResponse(created=counts.created,
                                         already_present=counts.already_present)

    # -- artifacts ----------------------------------------------------------

    def ImportArtifact(self, request_iterator: Iterator[pb.ImportArtifactRequest],
                       context: grpc.ServicerContext) -> pb.ImportArtifactResponse:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "artifact":
            raise InvalidArgument("an artifact import starts with the artifact",
                                  reason="UPLOAD_MALFORMED")
        artifact, created = self.imports.import_artifact(
            current_principal().fleet_id, artifact_from_proto(first.artifact),
            _upload_parts(request_iterator))
        return pb.ImportArtifactResponse(artifact=artifact_to_proto(artifact), created=created)

    def CreateArtifact(self, request_iterator: Iterator[pb.CreateArtifactRequest],
                       context: grpc.ServicerContext) -> pb.CreateArtifactResponse:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidArgument("an upload starts with a header message",
                                  reason="UPLOAD_MALFORMED")
        header = first.header
        upload = ArtifactUpload(
            run_id=header.run_id, step_id=header.step_id, name=header.name,
            mime_type=header.mime_type, metadata_json=header.metadata_json,
            expected_size_bytes=(header.expected_size_bytes
                                 if header.HasField("expected_size_bytes") else None),
            expected_hash=header.expected_hash)
        artifact = self.service.upload(current_principal().fleet_id, upload,
                                       _upload_parts(request_iterator))
        return pb.CreateArtifactResponse(artifact=artifact_to_proto(artifact))

    def GetArtifact(self, request: pb.GetArtifactRequest,
                    context: grpc.ServicerContext) -> pb.GetArtifactResponse:
        artifact = self.service.get_artifact(current_principal().fleet_id, request.artifact_id)
        return pb.GetArtifactResponse(artifact=artifact_to_proto(artifact))

    def ReadArtifact(self, request: pb.ReadArtifactRequest,
                     context: grpc.ServicerContext) -> Iterator[pb.ReadArtifactResponse]:
        if request.chunk_size < 0 or request.chunk_size > MAX_CHUNK_SIZE:
            raise InvalidArgument(f"chunk_size must be 0..{MAX_CHUNK_SIZE}")
        artifact, chunks = self.service.read(current_principal().fleet_id, request.artifact_id,
                                             request.chunk_size or 1 << 20)
        yield pb.ReadArtifactResponse(artifact=artifact_to_proto(artifact))
        for chunk in chunks:
            yield pb.ReadArtifactResponse(chunk=chunk)

    def ListArtifacts(self, request: pb.ListArtifactsRequest,
                      context: grpc.ServicerContext) -> pb.ListArtifactsResponse:
        found, token = self.service.list_artifacts(
            current_principal().fleet_id, request.run_id, request.step_id, request.page_token,
            request.page_size)
        return pb.ListArtifactsResponse(artifacts=[artifact_to_proto(a) for a in found],
                                        next_page_token=token)

    def VerifyArtifacts(self, request: pb.VerifyArtifactsRequest,
                        context: grpc.ServicerContext) -> pb.VerifyArtifactsResponse:
        fleet_id = current_principal().fleet_id
        # A whole fleet's blobs re-hashed take one of the replica's two scan slots: 128 such
        # calls held every worker for minutes, for every fleet, and went on hashing after
        # their callers had gone (found by review on 2026-11-30).
        scope = (self.service.whole_fleet_checks.slot("verifying every artifact of the fleet")
                 if not request.run_id else contextlib.nullcontext())
        with scope:
            checked, problems = self.service.verify(fleet_id, request.run_id, context.is_active)
            snapshots, tombstoned, snapshot_problems = self.service.verify_snapshots(
                fleet_id, request.run_id, context.is_active)
            # Each tombstone against the erasure it names, as governance recorded it.
            audit = self.service.verify_tombstones(fleet_id, request.run_id,
                                                   self.eraser.source, context.is_active)
            manifests, manifest_problems = self.service.verify_manifests(
                fleet_id, request.run_id, context.is_active)
        return pb.VerifyArtifactsResponse(
            manifests_checked=manifests, manifest_problems=[pb.ManifestProblem(
                manifest_id=p.manifest_id, run_id=p.run_id, problem=p.problem,
                expected_hash=p.expected_hash, actual_hash=p.actual_hash)
                for p in manifest_problems],
            checked=checked, problems=[problem_to_proto(p) for p in problems],
            snapshots_checked=snapshots, snapshots_tombstoned=tombstoned,
            snapshot_problems=[pb.SnapshotProblem(
                snapshot_id=p.snapshot_id, run_id=p.run_id, problem=p.problem,
                expected_hash=p.expected_hash, actual_hash=p.actual_hash)
                for p in snapshot_problems],
            events_tombstoned=audit.events, runs_tombstoned=audit.runs,
            tombstones_unconfirmed=audit.unconfirmed,
            tombstone_problems=[pb.TombstoneProblem(
                kind=p.kind, id=p.id, run_id=p.run_id, erasure_id=p.erasure_id,
                problem=p.problem, leaf_hash=p.leaf_hash) for p in audit.problems])

    # -- events and snapshots -----------------------------------------------

    def AppendEvent(self, request: pb.AppendEventRequest,
                    context: grpc.ServicerContext) -> pb.AppendEventResponse:
        caller = current_principal()
        event, created = self.service.append_event(
            caller.fleet_id, caller.agent_id, request.run_id, request.type,
            request.payload_json, request.manifest_id, tuple(request.artifact_ids),
            request.request_id)
        return pb.AppendEventResponse(event=event_to_proto(event), created=created)

    def ListEvents(self, request: pb.ListEventsRequest,
                   context: grpc.ServicerContext) -> pb.ListEventsResponse:
        events, token = self.service.list_events(
            current_principal().fleet_id, request.run_id, request.after_seq, request.page_token,
            request.page_size)
        return pb.ListEventsResponse(events=[event_to_proto(e) for e in events],
                                     next_page_token=token)

    def ReplayEvents(self, request: pb.ReplayEventsRequest,
                     context: grpc.ServicerContext) -> Iterator[pb.ReplayEventsResponse]:
        for event in self.service.replay(current_principal().fleet_id, request.run_id):
            yield pb.ReplayEventsResponse(event=event_to_proto(event))

    def CreateSnapshot(self, request: pb.CreateSnapshotRequest,
                       context: grpc.ServicerContext) -> pb.CreateSnapshotResponse:
        snapshot, created = self.service.create_snapshot(
            current_principal().fleet_id, request.run_id, request.state_json, request.seq,
            request.manifest_id, tuple(request.artifact_ids), request.request_id)
        return pb.CreateSnapshotResponse(snapshot=snapshot_to_proto(snapshot), created=created)

    def GetLatestSnapshot(self, request: pb.GetLatestSnapshotRequest,
                          context: grpc.ServicerContext) -> pb.GetLatestSnapshotResponse:
        snapshot = self.service.latest_snapshot(current_principal().fleet_id, request.run_id)
        return pb.GetLatestSnapshotResponse(snapshot=snapshot_to_proto(snapshot))

    def ListSnapshots(self, request: pb.ListSnapshotsRequest,
                      context: grpc.ServicerContext) -> pb.ListSnapshotsResponse:
        found, token = self.service.list_snapshots(
            current_principal().fleet_id, request.run_id, request.page_token, request.page_size)
        return pb.ListSnapshotsResponse(snapshots=[snapshot_to_proto(s) for s in found],
                                        next_page_token=token)

    def Rehydrate(self, request: pb.RehydrateRequest,
                  context: grpc.ServicerContext) -> pb.RehydrateResponse:
        caller = current_principal()
        view = self.service.rehydrate(caller.fleet_id, caller.agent_id, request.run_id,
                                      request.max_events)
        return pb.RehydrateResponse(
            run=run_to_proto(view.run),
            snapshot=None if view.snapshot is None else snapshot_to_proto(view.snapshot),
            events=[event_to_proto(e) for e in view.events], truncated=view.truncated,
            manifest=None if view.manifest is None else manifest_to_proto(view.manifest))

    # -- evidence and manifests ---------------------------------------------

    def CreateEvidence(self, request: pb.CreateEvidenceRequest,
                       context: grpc.ServicerContext) -> pb.CreateEvidenceResponse:
        evidence, created = self.service.create_evidence(
            current_principal().fleet_id, request.corpus_id, request.index_id, request.chunk_id,
            request.span.start, request.span.end, request.artifact_id, request.metadata_json)
        return pb.CreateEvidenceResponse(evidence=evidence_to_proto(evidence), created=created)

    def GetEvidence(self, request: pb.GetEvidenceRequest,
                    context: grpc.ServicerContext) -> pb.GetEvidenceResponse:
        evidence = self.service.get_evidence(current_principal().fleet_id, request.evidence_id)
        return pb.GetEvidenceResponse(evidence=evidence_to_proto(evidence))

    def ListEvidence(self, request: pb.ListEvidenceRequest,
                     context: grpc.ServicerContext) -> pb.ListEvidenceResponse:
        found, token = self.service.list_evidence(
            current_principal().fleet_id, request.corpus_id, request.index_id,
            request.page_token, request.page_size)
        return pb.ListEvidenceResponse(evidence=[evidence_to_proto(e) for e in found],
                                       next_page_token=token)

    def CreateManifest(self, request: pb.CreateManifestRequest,
                       context: grpc.ServicerContext) -> pb.CreateManifestResponse:
        manifest, created = self.service.create_manifest(
            current_principal().fleet_id, request.content_json, request.run_id)
        return pb.CreateManifestResponse(manifest=manifest_to_proto(manifest), created=created)

    def GetManifest(self, request: pb.GetManifestRequest,
                    context: grpc.ServicerContext) -> pb.GetManifestResponse:
        manifest = self.service.get_manifest(current_principal().fleet_id, request.manifest_id)
        return pb.GetManifestResponse(manifest=manifest_to_proto(manifest))

    def ListManifests(self, request: pb.ListManifestsRequest,
                      context: grpc.ServicerContext) -> pb.ListManifestsResponse:
        found, token = self.service.list_manifests(
            current_principal().fleet_id, request.run_id, request.page_token, request.page_size)
        return pb.ListManifestsResponse(manifests=[manifest_to_proto(m) for m in found],
                                        next_page_token=token)

    def ResolvePointer(self, request: pb.ResolvePointerRequest,
                       context: grpc.ServicerContext) -> pb.ResolvePointerResponse:
        caller = current_principal()
        kind = _POINTER_FROM_PB.get(request.pointer.type)
        if kind is None:
            raise InvalidArgument("pointer.type must be ARTIFACT, EVIDENCE or MANIFEST")
        outcome = self.service.resolve(caller.fleet_id, caller.agent_id, request.run_id,
                                       Pointer(kind, request.pointer.id), request.critical)
        return pb.ResolvePointerResponse(
            resolved=outcome.resolution.resolved, attempts=outcome.attempts,
            path=outcome.resolution.path, hash=outcome.resolution.hash)


def add_to_server(servicer: ArtifactsServicer, server: grpc.Server) -> None:
    pb_grpc.add_ArtifactsServiceServicer_to_server(servicer, server)
