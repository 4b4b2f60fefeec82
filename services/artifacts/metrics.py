"""The artifacts service's domain metrics on /metrics (read at scrape time)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from services.artifacts.service import ArtifactsService
from services.common.metrics import counter


class ArtifactsMetrics(Collector):
    def __init__(self, service: ArtifactsService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        yield counter("engram_artifacts_blob_bytes",
                      "Blob bytes stored by uploads (in) and served by reads (out).",
                      ["direction"], self._service.blob_bytes)
        yield counter("engram_integrity_failures",
                      "Blobs, snapshots and tombstones found altered, missing or erased by "
                      "no erasure by VerifyArtifacts.",
                      ["reason"], self._service.integrity_failures)
