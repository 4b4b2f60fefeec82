"""``--reissue-ids`` for the compactor's iteration logs: format-1 warm lines re-addressed
(see :mod:`engram.bundle.reissue`).

A format-1 line's ``detailDigest`` is the plain SHA-256 of its iteration's detail and its hash
covers every field. Each becomes a format-2 line: a salt derived under the key, the seed's
fields committed to under it, and ``detailDigest`` the detail's commitment where the bundle
carries the detail (else a value derived under the key: the detail is gone, nothing can be
checked against it). Each line's hash covers the one before, so a log's chain is derived
again from its first changed line on, and the erasures' ``iterations`` items (a log's head)
follow, and so do its ``iteration`` items (a line erased in place: its tombstone is linked
again like any format-2 line, its hash following from what it kept); a log erased whole is not
in the bundle, and its leaf is derived under the key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from engram.bundle.format import BundleError
from engram.bundle.reissue_chain import ChainLinks, Derive
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.governance.v1 import governance_service_pb2 as gpb
from services.common.commitment import commitment
from services.compactor.domain.warm_chain import IterationInput, WarmLine, detail_content
from services.compactor.servicer import summary_line, summary_pb


class IterationLines:
    """Plans (``plan``, in the bundle's order) and rewrites one bundle's warm lines."""

    def __init__(self, derive: Derive) -> None:
        self._derive = derive
        self.links = ChainLinks(derive, ("iterations", "iteration"))
        """Each log's chain (an erasure's ``iterations`` item names its head, an ``iteration``
        item a line erased in place)."""

    def plan(self, items: Iterable[tuple[str, cpb.ImportedIteration]]) -> None:
        for run_id, item in items:
            self.links.planned(item.summary.hash, self.iteration(run_id, item).summary.hash)
        self.links.end_pass()

    def iteration(self, run_id: str, item: cpb.ImportedIteration) -> cpb.ImportedIteration:
        """The line in format 2, linked to its predecessor's new hash (a run's lines are
        planned in order first)."""
        line = summary_line(item.summary)
        prev = self.links.prev(run_id, line.iteration, line.prev_hash)
        if line.format != 1 and prev == line.prev_hash:
            self.links.linked(run_id, line.iteration, line.hash)
            return item
        if line.format == 1:
            salt = self._derive("line-salt", f"{run_id}:{line.iteration}")
            try:
                digest = (commitment(salt, detail_content(item.detail_json,
                                                          item.guardrails_json))
                          # gone: derived from its place, so equal lost details look unequal
                          if item.detail_json
                          else self._derive("commitment", f"{run_id}:{line.iteration}"))
            except ValueError:
                raise BundleError(f"iteration {line.iteration} of run {run_id!r} carries a "
                                  "detail or guardrails that are not JSON; stopped before "
                                  "it") from None
            line = WarmLine.chained(IterationInput(
                iteration=line.iteration, plan_digest=line.plan_digest,
                parent_digest=line.parent_digest, start_ts=line.start_ts, end_ts=line.end_ts,
                files_touched=line.files_touched, net_add=line.net_add, net_del=line.net_del,
                risk_score=line.risk_score, status=line.status, detail_json="",
                guardrails_json=""), line.iteration, prev, digest=digest, salt=salt)
        else:
            line = replace(line, prev_hash=prev)
            line = replace(line, hash=line.computed_hash())
        renamed = cpb.ImportedIteration()
        renamed.CopyFrom(item)
        renamed.summary.CopyFrom(summary_pb(line))
        self.links.linked(run_id, line.iteration, line.hash)
        return renamed

    def erased_item(self, item: gpb.ErasedItem) -> None:
        """An erasure's ``iterations`` item (a log's head) or ``iteration`` item (a line erased
        in place, whose tombstone the bundle holds), renamed in place."""
        item.leaf_hash = self.links.leaf(item.leaf_hash)
