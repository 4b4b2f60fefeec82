"""Governance's domain metrics on /metrics (read at scrape time)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from services.common.metrics import counter, gauge
from services.governance.service import GovernanceService


class GovernanceMetrics(Collector):
    def __init__(self, service: GovernanceService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        yield counter("engram_gate_decisions",
                      "Gate decisions recorded, by outcome and, for a denial, the kind of rule "
                      "that denied it (suspended: the agent's tier).",
                      ["outcome", "rule"], self._service.decisions)
        yield counter("engram_integrity_failures",
                      "Problems found by witness-chain verifications.", ["reason"],
                      self._service.integrity_failures)
        yield gauge("engram_governance_chain_intact",
                    "1 while the witness chain verifies, 0 once a verification found it broken.",
                    1.0 if self._service.chain_intact else 0.0)
