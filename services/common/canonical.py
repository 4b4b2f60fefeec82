"""Canonical JSON: the one byte form that every content hash and hash chain is computed over.

Keys sorted, no whitespace, UTF-8 kept as is, NaN and infinities refused. Every record hash,
witness link, event chain and warm-log line depends on these bytes, so they are pinned by a
test (tests/unit/common/test_canonical.py); change nothing here without a migration.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON text; raises ``ValueError`` for NaN or an infinity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def canonical_bytes(value: Any) -> bytes:
    """``canonical_json(value)`` encoded as UTF-8, the form hashes are taken over."""
    return canonical_json(value).encode()
