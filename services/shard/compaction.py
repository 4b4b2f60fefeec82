"""Memory compaction (seed 001 roadmap): summarise old, unimportant records.

Decayed importance = importance x 2^(-age / DECAY_HALF_LIFE_DAYS): a record
loses half its weight every 90 days. Records of one fleet, older than the
policy age and below the threshold, are grouped by (run, domain) and
replaced in search by a summary record whose metadata keeps the ids and
record hashes of what it covers. Originals stay stored and verifiable; only
:meth:`MemoryCompactor.apply_retention`, an explicit call, removes them.
A summary's content is deterministic, so a retried compaction lands on the
same summary id rather than a second summary.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.errors import InvalidArgument
from services.common.tokens import Principal
from services.shard.domain.records import MAX_CONTENT_BYTES, Record, RecordDraft
from services.shard.repository import RecordFilter
from services.shard.service import ShardService

DECAY_HALF_LIFE_DAYS = 90.0
MAX_GROUP = 40
_SNIPPET_CHARS = 160
SUMMARY_SOURCE = "compactor"


def decayed_importance(importance: float, age_days: float) -> float:
    return importance * math.exp2(-max(0.0, age_days) / DECAY_HALF_LIFE_DAYS)


@dataclass(frozen=True)
class CompactionGroup:
    domain: str
    run_id: str
    replaced_ids: tuple[str, ...]
    replaced_hashes: tuple[str, ...]
    summary: Record | None = None


@dataclass
class CompactionReport:
    examined: int = 0
    compacted: int = 0
    groups: list[CompactionGroup] = field(default_factory=list)


def summary_text(domain: str, run_id: str, originals: list[Record]) -> str:
    head = (
        f"Summary of {len(originals)} older memories in domain {domain}"
        + (f", run {run_id}" if run_id else "")
        + ": "
    )
    parts = []
    for record in originals:
        snippet = " ".join(record.content.split())
        parts.append(
            snippet if len(snippet) <= _SNIPPET_CHARS else snippet[: _SNIPPET_CHARS - 1] + "…"
        )
    text = head + " | ".join(parts)
    while len(text.encode()) > MAX_CONTENT_BYTES:
        text = text[: len(text) * 9 // 10]
    return text


class MemoryCompactor:
    def __init__(self, service: ShardService, clock: Callable[[], float] | None = None) -> None:
        self.service = service
        self.clock = clock or service.clock

    def candidates(
        self, fleet_id: str, importance_below: float, older_than_days: float
    ) -> tuple[int, dict[tuple[str, str], list[Record]]]:
        if not 0.0 <= importance_below <= 1.0 or older_than_days < 0:
            raise InvalidArgument(
                "importance_below must be 0..1 and older_than_days >= 0", reason="INVALID_POLICY"
            )
        now = self.clock()
        cutoff_us = (now - older_than_days * 86400) * 1_000_000
        examined = 0
        groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
        with self.service.db.session() as session:
            done = self.service.repo.compacted_ids(session, fleet_id)
            for record in self.service.repo.scan(session, RecordFilter(fleet_id)):
                examined += 1
                if record.id in done or record.source == SUMMARY_SOURCE:
                    continue
                if record.created_us >= cutoff_us:
                    continue
                age_days = (now * 1_000_000 - record.created_us) / 86_400_000_000
                if decayed_importance(record.importance, age_days) < importance_below:
                    groups[(record.run_id, record.domain)].append(record)
        return examined, groups

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
                    group = self._write_summary(principal, group, chunk)
                report.groups.append(group)
                report.compacted += len(chunk)
        return report

    def _write_summary(
        self, principal: Principal, group: CompactionGroup, chunk: list[Record]
    ) -> CompactionGroup:
        draft = RecordDraft(
            content=summary_text(group.domain, group.run_id, chunk),
            run_id=group.run_id,
            domain=group.domain,
            source=SUMMARY_SOURCE,
            importance=max(r.importance for r in chunk),
            tags=("summary",),
            metadata={
                "replaces": json.dumps(
                    [{"id": r.id, "record_hash": r.record_hash} for r in chunk],
                    separators=(",", ":"),
                )
            },
        )
        summary = self.service.write(principal, [draft])[0].record
        now_us = int(self.clock() * 1_000_000)
        with self.service.db.session() as session:
            done = self.service.repo.compacted_ids(session, principal.fleet_id)
            fresh = [r for r in chunk if r.id not in done]
            if fresh:
                self.service.repo.mark_compacted(
                    session, principal.fleet_id, summary.id, fresh, now_us
                )
        return CompactionGroup(
            group.domain, group.run_id, group.replaced_ids, group.replaced_hashes, summary
        )

    def apply_retention(self, fleet_id: str, older_than_days: float, dry_run: bool) -> list[str]:
        if older_than_days <= 0:
            raise InvalidArgument(
                "older_than_days must be > 0 for a retention policy", reason="INVALID_POLICY"
            )
        cutoff_us = int((self.clock() - older_than_days * 86400) * 1_000_000)
        with self.service.db.session() as session:
            ids = self.service.repo.covered_before(session, fleet_id, cutoff_us)
            if not dry_run:
                self.service.repo.remove(session, fleet_id, ids)
        return ids
