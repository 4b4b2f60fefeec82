"""Memory compaction policy (seed 001 roadmap): which old, unimportant records a summary replaces.

Decayed importance = importance x 2^(-age / DECAY_HALF_LIFE_DAYS): a record
loses half its weight every 90 days. Records of one fleet, older than the
policy age and below the threshold, are grouped by (run, domain) and
replaced in search by a summary record whose metadata keeps the ids and
record hashes of what it covers and names their authors (``source_authors``),
so search ranks the summary with the lowest trust among them. A summary's
content is deterministic, so a retried compaction lands on the same summary id
rather than a second summary.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from services.common.errors import InvalidArgument
from services.common.limits import check_policy_days
from services.shard.domain.records import MAX_CONTENT_BYTES, Record, RecordDraft

DECAY_HALF_LIFE_DAYS = 90.0
MAX_GROUP = 40
_SNIPPET_CHARS = 160
SUMMARY_SOURCE = "compactor"
SOURCE_AUTHORS_KEY = "source_authors"


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


def check_policy(importance_below: float, older_than_days: float) -> None:
    if not 0.0 <= importance_below <= 1.0:  # NaN fails too
        raise InvalidArgument(
            f"importance_below must be 0..1, got {importance_below}", reason="INVALID_POLICY"
        )
    check_policy_days(older_than_days, retention=False)


def check_retention(older_than_days: float) -> None:
    check_policy_days(older_than_days, retention=True)


def compactable(record: Record, now: float, importance_below: float,
                older_than_days: float) -> bool:
    """An original (not a summary) older than the policy age whose decayed importance is low."""
    if record.source == SUMMARY_SOURCE:
        return False
    if record.created_us >= (now - older_than_days * 86400) * 1_000_000:
        return False
    age_days = (now * 1_000_000 - record.created_us) / 86_400_000_000
    return decayed_importance(record.importance, age_days) < importance_below


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


def summary_draft(domain: str, run_id: str, originals: list[Record]) -> RecordDraft:
    """The summary record of ``originals``; its ``replaces`` metadata names each one's hash."""
    return RecordDraft(
        content=summary_text(domain, run_id, originals),
        run_id=run_id,
        domain=domain,
        source=SUMMARY_SOURCE,
        importance=max(r.importance for r in originals),
        tags=("summary",),
        metadata={
            "replaces": json.dumps(
                [{"id": r.id, "record_hash": r.record_hash} for r in originals],
                separators=(",", ":"),
            ),
            SOURCE_AUTHORS_KEY: json.dumps(sorted({r.agent_id for r in originals}),
                                           separators=(",", ":")),
        },
    )
