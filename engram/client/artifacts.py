"""Python SDK for the artifacts service: runs, streamed artifacts, events, snapshots, evidence.

    with ArtifactsClient(settings.artifacts_addr, settings.resolve_token()) as artifacts:
        run = artifacts.start_run().run
        art = artifacts.upload_file(Path("report.pdf"), run_id=run.run_id, step_id="s1")
        artifacts.download(art.artifact_id, Path("copy.pdf"))  # hash-checked, atomic
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Generic, TypeVar

import grpc

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.artifacts.v1 import artifacts_service_pb2_grpc as pb_grpc
from engram.client._channel import (
    RETRY_BUFFER_BYTES,
    BaseClient,
    UnaryCall,
    idempotency_key,
    string_list,
)
from engram.client._errors import EngramRpcError

CHUNK_SIZE = 1 << 20
_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_QUOTED = r'"[ !#-\[\]-~]*"'
MIME_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*")
"""A media type as HTTP carries it (RFC 9110: type/subtype and parameters, printable ASCII):
the artifacts service stores no other, and the gateway serves no other as Content-Type."""
DownloadProgress = Callable[[pb.Artifact, int], None]
"""Called with the artifact and the bytes written so far: once at 0, then after each chunk."""
STOP_STATUSES = {
    "succeeded": pb.RUN_STATUS_SUCCEEDED,
    "failed": pb.RUN_STATUS_FAILED,
    "cancelled": pb.RUN_STATUS_CANCELLED,
}
POINTER_TYPES = {
    "artifact": pb.POINTER_TYPE_ARTIFACT,
    "evidence": pb.POINTER_TYPE_EVIDENCE,
    "manifest": pb.POINTER_TYPE_MANIFEST,
}


JsonDocument = Mapping[str, object] | Sequence[object] | str | float | bool | None
"""A value sent as JSON; a ``str`` is taken as JSON text already encoded (``'{"k": 1}'``)."""
JsonObject = Mapping[str, object] | str
"""A JSON object, or its JSON text."""


def _json(value: JsonDocument) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def file_chunks(path: Path, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            yield chunk


M = TypeVar("M", pb.CreateArtifactRequest, pb.ImportArtifactRequest)


def _streamed(kind: type[M], first: M, chunks: Iterable[bytes]) -> Iterator[M]:
    """``first``, the chunks, then the trailer: what tells the service the stream was not
    cut short (its size and SHA-256 as sent)."""
    yield first
    digest, sent = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        sent += len(chunk)
        yield kind(chunk=chunk)
    yield kind(trailer=pb.ArtifactTrailer(size_bytes=sent, sha256=digest.hexdigest()))


R = TypeVar("R")


class _Sent(Generic[M]):
    """The messages of one streamed upload as gRPC takes them, kept while they fit in
    ``RETRY_BUFFER_BYTES`` so that the whole stream can be sent again; ``complete`` once the
    last one (the trailer) was taken, ``sent`` the size that trailer declares."""

    def __init__(self, messages: Iterator[M]) -> None:
        self._messages: Iterator[M] = messages
        self.kept: list[M] | None = []
        self._kept_bytes = 0
        self.complete = False
        self.sent: int | None = None

    def __iter__(self) -> _Sent[M]:
        return self

    def __next__(self) -> M:
        try:
            message = next(self._messages)
        except StopIteration:
            self.complete = True
            raise
        if message.WhichOneof("part") == "trailer":
            self.sent = message.trailer.size_bytes
        if self.kept is not None:
            self._kept_bytes += message.ByteSize()
            if self._kept_bytes > RETRY_BUFFER_BYTES:
                self.kept = None
            else:
                self.kept.append(message)
        return message


class ArtifactsClient(BaseClient):
    """``ArtifactsClient(target, token)``; every method raises ``EngramRpcError`` on failure.

    Streaming calls (uploads, downloads, replay) run without a deadline unless
    ``stream_timeout`` is set: a 1 GB artifact takes longer than a unary call.
    """

    def __init__(self, target: str, token: str, *, tls_ca: Path | None = None,
                 tls_cert: Path | None = None, tls_key: Path | None = None,
                 timeout: float = 30.0, stream_timeout: float | None = None,
                 channel: grpc.Channel | None = None) -> None:
        super().__init__(target, token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                         timeout=timeout, channel=channel)
        self.stream_timeout = stream_timeout

    @cached_property
    def stub(self) -> pb_grpc.ArtifactsServiceStub:
        return pb_grpc.ArtifactsServiceStub(self.channel)

    # -- runs ---------------------------------------------------------------

    def start_run(self, run_id: str = "",
                  metadata: JsonObject | None = None) -> pb.StartRunResponse:
        """Start a run (``created: false`` when ``run_id`` names one already running). Without
        ``run_id`` the SDK names it (``run_<32 hex>``), as the TypeScript client does: the id is
        always sent, so a start the channel retries finds its run instead of starting two."""
        request = pb.StartRunRequest(run_id=run_id or f"run_{uuid.uuid4().hex}",
                                     metadata_json=_json(metadata) if metadata else "")
        return self.call(self.stub.StartRun, request)

    def get_run(self, run_id: str) -> pb.Run:
        return self.call(self.stub.GetRun, pb.GetRunRequest(run_id=run_id)).run

    def list_runs(self, page_size: int = 0) -> Iterator[pb.Run]:
        """The fleet's runs, newest first, following page tokens."""
        return self.paginate(self.stub.ListRuns, pb.ListRunsRequest(page_size=page_size),
                             lambda reply: reply.runs)

    def find_runs(self, match: str, limit: int = 0, page_token: str = "") -> pb.FindRunsResponse:
        """One page of the runs holding ``match`` anywhere (governor or admin role; reads
        every blob); ``next_page_token`` lists the rest."""
        return self.call(self.stub.FindRuns, pb.FindRunsRequest(match=match, limit=limit,
                                                                page_token=page_token))

    def forget_runs(self, erasure_id: str) -> pb.ForgetRunsResponse:
        """Erase the runs governance's erasure of that id lists, and its single events and
        snapshots in place (governor or admin role)."""
        return self.call(self.stub.ForgetRuns, pb.ForgetRunsRequest(erasure_id=erasure_id))

    def stop_run(self, run_id: str, status: str = "succeeded", reason: str = "") -> pb.Run:
        request = pb.StopRunRequest(run_id=run_id, status=STOP_STATUSES[status], reason=reason)
        return self.call(self.stub.StopRun, request).run

    # -- artifacts ----------------------------------------------------------

    def upload(self, chunks: Iterable[bytes], *, run_id: str, step_id: str, name: str,
               mime_type: str = "", metadata: JsonObject | None = None,
               size_bytes: int | None = None,
               sha256: str = "") -> pb.Artifact:
        header = pb.ArtifactHeader(run_id=run_id, step_id=step_id, name=name,
                                   mime_type=mime_type,
                                   metadata_json=_json(metadata) if metadata else "",
                                   expected_hash=sha256)
        if size_bytes is not None:
            header.expected_size_bytes = size_bytes

        requests = _streamed(pb.CreateArtifactRequest, pb.CreateArtifactRequest(header=header),
                             chunks)
        return self._send_stream(self.stub.CreateArtifact, requests, size_bytes).artifact

    # -- imports (engram import-bundle; admin) --------------------------------

    def import_run(self, run: pb.Run) -> pb.ImportRunResponse:
        return self.call(self.stub.ImportRun, pb.ImportRunRequest(run=run))

    def import_artifact(self, artifact: pb.Artifact,
                        chunks: Iterable[bytes]) -> pb.ImportArtifactResponse:
        """The artifact as its origin returned it, with its bytes (which must be its own)."""
        requests = _streamed(pb.ImportArtifactRequest, pb.ImportArtifactRequest(
            artifact=artifact), chunks)
        return self._send_stream(self.stub.ImportArtifact, requests, artifact.size_bytes)

    def _send_stream(self, method: UnaryCall[Iterator[M], R], requests: Iterator[M],
                     declared: int | None) -> R:
        """An upload's stream, sent again whole when the service received it cut short
        although all of it was sent.

        gRPC's retry of a stream whose attempt failed while it was still being sent (an I/O
        error of the service, say) can deliver the next attempt without some of the messages
        taken meanwhile (seen with grpcio 1.85: the trailer, or chunks in the middle, missing;
        every later attempt replays the same). The trailer lets the service see it and store
        nothing (``UPLOAD_TRUNCATED``); the stream this SDK sent was whole, so it is sent
        again from what was kept (at most ``max_retries`` times, within ``stream_timeout``).
        A stream too large to keep is the caller's to send again: that failure is
        ``UNAVAILABLE``, not the ``INVALID_ARGUMENT`` of a stream the caller cut short.
        """
        deadline = None if self.stream_timeout is None else \
            time.monotonic() + self.stream_timeout
        sent, resends = _Sent(requests), self.max_retries
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return self.call(method, sent, timeout=remaining)
            except EngramRpcError as failure:
                whole = (failure.reason == "UPLOAD_TRUNCATED" and sent.complete
                         and (declared is None or sent.sent == declared))
                if not whole:
                    raise
                if (sent.kept is None or resends <= 0
                        or (deadline is not None and time.monotonic() >= deadline)):
                    raise EngramRpcError(
                        grpc.StatusCode.UNAVAILABLE,
                        "the service received this upload incomplete although all of it was "
                        "sent (cut on the way: gRPC's retry of an attempt that failed mid-stream "
                        f"can drop messages); {failure.message}; send it again",
                        failure.reason, failure.metadata) from failure
            resends -= 1
            sent = _Sent(iter(sent.kept))

    def import_run_items(self, *, manifests: Iterable[pb.Manifest] = (),
                         evidence: Iterable[pb.Evidence] = (), events: Iterable[pb.Event] = (),
                         snapshots: Iterable[pb.Snapshot] = ()) -> pb.ImportRunItemsResponse:
        return self.call(self.stub.ImportRunItems, pb.ImportRunItemsRequest(
            manifests=manifests, evidence=evidence, events=events, snapshots=snapshots))

    def upload_file(self, path: Path, *, run_id: str, step_id: str, name: str = "",
                    mime_type: str = "", metadata: JsonObject | None = None,
                    chunk_size: int = CHUNK_SIZE) -> pb.Artifact:
        """Streams a file; its size travels with it so a cut-off upload is refused."""
        return self.upload(file_chunks(path, chunk_size), run_id=run_id, step_id=step_id,
                           name=name or path.name, mime_type=mime_type, metadata=metadata,
                           size_bytes=path.stat().st_size)

    def get_artifact(self, artifact_id: str) -> pb.Artifact:
        return self.call(self.stub.GetArtifact,
                         pb.GetArtifactRequest(artifact_id=artifact_id)).artifact

    def read(self, artifact_id: str, chunk_size: int = 0) -> tuple[pb.Artifact, Iterator[bytes]]:
        """The artifact's metadata and its bytes; the stream raises DATA_LOSS on a bad hash."""
        request = pb.ReadArtifactRequest(artifact_id=artifact_id, chunk_size=chunk_size)
        replies = self.stream(self.stub.ReadArtifact, request, timeout=self.stream_timeout)
        first = next(replies)
        return first.artifact, (reply.chunk for reply in replies)

    def download(self, artifact_id: str, destination: Path, chunk_size: int = 0,
                 progress: DownloadProgress | None = None) -> pb.Artifact:
        """Writes to a temporary file, hashing as it goes; the file takes its name only when
        its size and SHA-256 are the artifact's (raises DATA_LOSS otherwise, nothing left)."""
        artifact, chunks = self.read(artifact_id, chunk_size)
        partial = destination.with_name(f".{destination.name}.{os.getpid()}.part")
        digest, written = hashlib.sha256(), 0
        try:
            with partial.open("wb") as handle:
                if progress is not None:
                    progress(artifact, 0)
                for chunk in chunks:
                    handle.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
                    if progress is not None:
                        progress(artifact, written)
                handle.flush()
                os.fsync(handle.fileno())
            if written != artifact.size_bytes or digest.hexdigest() != artifact.hash:
                raise EngramRpcError(
                    grpc.StatusCode.DATA_LOSS,
                    f"artifact {artifact_id} arrived as {written} bytes with SHA-256 "
                    f"{digest.hexdigest()}, not the {artifact.size_bytes} bytes with "
                    f"SHA-256 {artifact.hash} it was stored with; {destination} was not written",
                    "DOWNLOAD_MISMATCH")
            os.replace(partial, destination)
        finally:
            partial.unlink(missing_ok=True)
        return artifact

    def list_artifacts(self, run_id: str, step_id: str = "",
                       page_size: int = 0) -> Iterator[pb.Artifact]:
        """A run's artifacts (of one step, if given), oldest first, following page tokens."""
        request = pb.ListArtifactsRequest(run_id=run_id, step_id=step_id, page_size=page_size)
        return self.paginate(self.stub.ListArtifacts, request, lambda reply: reply.artifacts)

    def verify(self, run_id: str = "") -> pb.VerifyArtifactsResponse:
        return self.call(self.stub.VerifyArtifacts, pb.VerifyArtifactsRequest(run_id=run_id),
                         timeout=self.stream_timeout)

    # -- events and snapshots -----------------------------------------------

    def append_event(self, run_id: str, type: str, payload: JsonDocument = None, *,
                     manifest_id: str = "", artifact_ids: Sequence[str] = (),
                     request_id: str = "") -> pb.AppendEventResponse:
        request = pb.AppendEventRequest(run_id=run_id, type=type,
                                        payload_json=_json(payload) if payload is not None
                                        else "", manifest_id=manifest_id,
                                        artifact_ids=string_list("artifact_ids", artifact_ids),
                                        request_id=idempotency_key(request_id))
        return self.call(self.stub.AppendEvent, request)

    def list_events(self, run_id: str, after_seq: int = 0,
                    page_size: int = 0) -> Iterator[pb.Event]:
        """A run's events after ``after_seq``, in order, following page tokens."""
        request = pb.ListEventsRequest(run_id=run_id, after_seq=after_seq, page_size=page_size)
        return self.paginate(self.stub.ListEvents, request, lambda reply: reply.events)

    def replay(self, run_id: str) -> Iterator[pb.Event]:
        for reply in self.stream(self.stub.ReplayEvents, pb.ReplayEventsRequest(run_id=run_id),
                                 timeout=self.stream_timeout):
            yield reply.event

    def create_snapshot(self, run_id: str, state: JsonDocument, *, seq: int = 0,
                        manifest_id: str = "", artifact_ids: Sequence[str] = (),
                        request_id: str = "") -> pb.Snapshot:
        """A retry with the same ``request_id`` returns the snapshot the first call made."""
        request = pb.CreateSnapshotRequest(run_id=run_id, state_json=_json(state), seq=seq,
                                           manifest_id=manifest_id,
                                           artifact_ids=string_list("artifact_ids", artifact_ids),
                                           request_id=idempotency_key(request_id))
        return self.call(self.stub.CreateSnapshot, request).snapshot

    def latest_snapshot(self, run_id: str) -> pb.Snapshot:
        return self.call(self.stub.GetLatestSnapshot,
                         pb.GetLatestSnapshotRequest(run_id=run_id)).snapshot

    def list_snapshots(self, run_id: str, page_size: int = 0) -> Iterator[pb.Snapshot]:
        """A run's snapshots, following page tokens."""
        request = pb.ListSnapshotsRequest(run_id=run_id, page_size=page_size)
        return self.paginate(self.stub.ListSnapshots, request, lambda reply: reply.snapshots)

    def rehydrate(self, run_id: str, max_events: int = 0) -> pb.RehydrateResponse:
        return self.call(self.stub.Rehydrate,
                         pb.RehydrateRequest(run_id=run_id, max_events=max_events))

    # -- evidence, manifests, pointers --------------------------------------

    def create_evidence(self, corpus_id: str, index_id: str, chunk_id: str, start: int,
                        end: int, *, artifact_id: str = "",
                        metadata: JsonObject | None = None) -> pb.CreateEvidenceResponse:
        request = pb.CreateEvidenceRequest(
            corpus_id=corpus_id, index_id=index_id, chunk_id=chunk_id,
            span=pb.Span(start=start, end=end), artifact_id=artifact_id,
            metadata_json=_json(metadata) if metadata else "")
        return self.call(self.stub.CreateEvidence, request)

    def get_evidence(self, evidence_id: str) -> pb.Evidence:
        return self.call(self.stub.GetEvidence,
                         pb.GetEvidenceRequest(evidence_id=evidence_id)).evidence

    def create_manifest(self, content: JsonDocument,
                        run_id: str = "") -> pb.CreateManifestResponse:
        return self.call(self.stub.CreateManifest,
                         pb.CreateManifestRequest(content_json=_json(content), run_id=run_id))

    def get_manifest(self, manifest_id: str) -> pb.Manifest:
        return self.call(self.stub.GetManifest,
                         pb.GetManifestRequest(manifest_id=manifest_id)).manifest

    def resolve(self, run_id: str, pointer_type: str, pointer_id: str,
                critical: bool = True) -> pb.ResolvePointerResponse:
        request = pb.ResolvePointerRequest(
            run_id=run_id, critical=critical,
            pointer=pb.Pointer(type=POINTER_TYPES[pointer_type], id=pointer_id))
        return self.call(self.stub.ResolvePointer, request)
