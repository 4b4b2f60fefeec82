"""Cross-reference detection (seed 001) with injection limits.

The four patterns: ``shard:<target>``, ``see shard <target>``,
``connect with shard <target>`` and ``voir shard <target>``. A target is a
domain name (``technical`` or ``shard_technical``) or a record id. Names are
bounded by the patterns themselves (1..64 safe characters, linear-time
regexes) and a record may hold at most :data:`MAX_CROSS_REFS` references, so
content cannot fan out into unbounded links (cross-reference injection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.common.errors import InvalidArgument

MAX_CROSS_REFS = 8
_TARGET = r"([A-Za-z0-9][A-Za-z0-9_\-]{0,63})(?![A-Za-z0-9_\-])"
_PATTERNS = (
    re.compile(r"(?<![A-Za-z0-9_])shard:" + _TARGET, re.IGNORECASE),
    re.compile(r"\bsee\s+shard\s+" + _TARGET, re.IGNORECASE),
    re.compile(r"\bconnect\s+with\s+shard\s+" + _TARGET, re.IGNORECASE),
    re.compile(r"\bvoir\s+shard\s+" + _TARGET, re.IGNORECASE),
)
_RECORD_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class CrossRef:
    kind: str
    """``domain`` or ``record``."""
    target: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"

    @classmethod
    def parse(cls, text: str) -> CrossRef:
        kind, _, target = text.partition(":")
        return cls(kind, target)


def detect(content: str) -> list[str]:
    """Raw targets mentioned in ``content``, in order of first appearance, deduplicated."""
    if "shard" not in content.lower():
        return []  # every pattern names "shard"; most memories never do
    found: dict[str, int] = {}
    for pattern in _PATTERNS:
        for match in pattern.finditer(content):
            target = match.group(1).lower()
            found.setdefault(target, match.start())
    return sorted(found, key=found.__getitem__)


def looks_like_record_id(target: str) -> bool:
    return bool(_RECORD_ID.match(target))


def check_count(targets: list[str]) -> None:
    if len(targets) > MAX_CROSS_REFS:
        raise InvalidArgument(
            f"content references {len(targets)} shards; at most {MAX_CROSS_REFS} "
            "cross-references are allowed per record",
            reason="TOO_MANY_CROSS_REFERENCES",
        )
