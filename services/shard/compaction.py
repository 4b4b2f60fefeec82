"""MemoryCompactor: the compaction and retention use cases (the policy is domain/compaction.py).

Compaction writes each group's summary through the shard's own write path (the
gate decides it like any write), then marks the originals it covers. Originals
stay stored and verifiable; only :meth:`MemoryCompactor.apply_retention`, an
explicit call, removes them.

Trust counts as it does in search: a record whose author's multiplier is 0.0
(suspended), or unknown because governance cannot be asked, is left out, so a
suspended agent's text is never laundered into a summary written by the
compactor; the summary names its sources' authors and ranks with the lowest
of their trust.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

from services.common.tokens import Principal
from services.shard.domain.compaction import (
    MAX_GROUP,
    CompactionGroup,
    CompactionReport,
    check_policy,
    check_retention,
    compactable,
    summary_draft,
)
from services.shard.domain.records import Record
from services.shard.repository import RecordFilter
from services.shard.service import ShardService, SourcesErased

log = logging.getLogger("engram.shard.compaction")


class MemoryCompactor:
    def __init__(self, service: ShardService, clock: Callable[[], float] | None = None) -> None:
        self.service = service
        self.clock = clock or service.clock

    def candidates(
        self, fleet_id: str, importance_below: float, older_than_days: float
    ) -> tuple[int, dict[tuple[str, str], list[Record]]]:
        check_policy(importance_below, older_than_days)
        now = self.clock()
        examined = 0
        groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
        with self.service.db.session() as session:
            done = self.service.repo.compacted_ids(session, fleet_id)
            for record in self.service.repo.scan(session, RecordFilter(fleet_id)):
                examined += 1
                if record.id not in done and compactable(record, now, importance_below,
                                                         older_than_days):
                    groups[(record.run_id, record.domain)].append(record)
        trusted = self._trusted_authors(fleet_id, {r.agent_id for g in groups.values() for r in g})
        kept = {key: [r for r in members if r.agent_id in trusted]
                for key, members in groups.items()}
        return examined, {key: members for key, members in kept.items() if members}

    def _trusted_authors(self, fleet_id: str, authors: set[str]) -> set[str]:
        """Authors whose records may be summarised: a known multiplier above 0."""
        trust = self.service.search_engine.trust
        if trust is None or not authors:  # an ungated shard has no trust to consult
            return authors
        multipliers = trust.multipliers(fleet_id, authors)
        return {a for a in authors if multipliers.get(a, 0.0) > 0.0}

    def compact(
        self,
        fleet_id: str,
        *,
        importance_below: float = 0.3,
        older_than_days: float = 30.0,
        dry_run: bool = False,
        author: str = "compactor",
    ) -> CompactionReport:
        examined, groups = self.candidates(fleet_id, importance_below, older_than_days)
        report = CompactionReport(examined=examined)
        principal = Principal(agent_id=author, fleet_id=fleet_id, roles=frozenset({"service"}))
        for (run_id, domain), members in sorted(groups.items()):
            for start in range(0, len(members), MAX_GROUP):
                chunk = members[start : start + MAX_GROUP]
                group = CompactionGroup(
                    domain, run_id, tuple(r.id for r in chunk), tuple(r.record_hash for r in chunk)
                )
                if not dry_run:
                    summarised = self._write_summary(principal, group, chunk)
                    if summarised is None:
                        continue
                    group = summarised
                report.groups.append(group)
                report.compacted += len(chunk)
        return report

    def _write_summary(
        self, principal: Principal, group: CompactionGroup, chunk: list[Record]
    ) -> CompactionGroup | None:
        """The group with its summary; None when an erasure took one of its originals first
        (the summary would keep erased text: nothing is stored, a later run groups again)."""
        draft = summary_draft(group.domain, group.run_id, chunk)
        try:
            written = self.service.write(principal, [draft], compacts=chunk)[0]
            if not written.created:  # the same summary stored before: its write committed nothing
                self.service.mark_compacted(principal.fleet_id, written.record.id, chunk)
        except SourcesErased as erased:
            log.info("compaction group skipped: originals erased meanwhile",
                     extra={"fleet_id": principal.fleet_id, "run_id": group.run_id,
                            "erased": erased.ids[:10]})
            return None
        return CompactionGroup(
            group.domain, group.run_id, group.replaced_ids, group.replaced_hashes, written.record
        )

    def apply_retention(self, fleet_id: str, older_than_days: float, dry_run: bool) -> list[str]:
        check_retention(older_than_days)
        cutoff_us = int((self.clock() - older_than_days * 86400) * 1_000_000)
        with self.service.db.session() as session:
            ids = self.service.repo.covered_before(session, fleet_id, cutoff_us)
            if not dry_run:
                self.service.repo.remove(session, fleet_id, ids)
        index = self.service.search_engine.index
        if ids and not dry_run and index is not None:
            # their terms and vectors leave this replica's index and its saved snapshot too
            index.forget(fleet_id, ids)
        return ids
