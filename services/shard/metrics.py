"""The shard's domain metrics on /metrics (read at scrape time; nothing counted twice)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from services.common.metrics import counter, gauge
from services.shard.governance_gate import GovernanceGate
from services.shard.search.index import SearchIndex
from services.shard.service import ShardService


class ShardMetrics(Collector):
    def __init__(self, service: ShardService, index: SearchIndex) -> None:
        self._service = service
        self._index = index

    def collect(self) -> Iterator[Metric]:
        yield counter("engram_shard_records_written",
                      "Records stored by committed writes (not those a retry or a duplicate "
                      "found already stored).", [], self._service.written)
        yield counter("engram_shard_records_erased",
                      "Records erased by engram forget, by kind (record, or a compaction "
                      "summary that quoted one).", ["kind"], self._service.erased)
        yield counter("engram_integrity_failures",
                      "Items found altered or unreadable by a verify or a verified read.",
                      ["reason"], self._service.integrity_failures)
        gate = self._service.gate
        if isinstance(gate, GovernanceGate):
            yield counter("engram_shard_gate_calls",
                          "Calls to governance's gate, by kind: single (DecideWrites) or batch "
                          "(DecideWriteBatches, concurrent writes' requests coalesced).",
                          ["kind"], gate.calls)
            yield counter("engram_shard_gate_requests",
                          "Gate requests those calls carried (one per write, two when "
                          "governance asked for neighbours).", [], gate.requests)
        yield gauge("engram_shard_index_lag_records",
                    "Committed records not yet in the vector index.", self._index.lag())
        yield gauge("engram_shard_index_lag_seconds",
                    "Age of the oldest committed record not yet in the vector index.",
                    self._index.lag_seconds(int(time.time() * 1_000_000)))
        yield gauge("engram_shard_embedder_queue_records",
                    "Records queued for or in the embedder, not yet embedded.",
                    self._index.embed_queue())
        yield counter("engram_shard_index_change_failures",
                      "Changes to the in-memory search index that raised and were dropped: "
                      "their records are stored but left out of this replica's search index "
                      "(the log names each).", [], self._index.change_failures,
                      known=[()])
        yield counter("engram_shard_embedder_failures",
                      "Embedder failures the shard absorbed without an error, by stage: query "
                      "(a hybrid search ranked lexically, its query not embedded), index (an "
                      "indexing batch put back to be retried).", ["stage"],
                      self._index.embedder_failures,
                      known=[("query",), ("index",)] if self._index.embedder else [])
