"""Salted commitments (docs/erasure.md, "The choice: a salted commitment per item").

``commitment = SHA-256("engram-commit-v2" 0x1f || salt || canonical content)``: stored or
chained where a plain hash of the content was, it verifies exactly as that hash did while the
content and its salt are kept, and confirms no guess once both are erased. The same bytes as
a format-2 record's ``body_commitment`` (services/shard/domain/records.py), whose canonical
content is its ``{content, tags, metadata}``.
"""

from __future__ import annotations

import hashlib
import re
import secrets

COMMIT_LABEL = b"engram-commit-v2\x1f"
SALT_BYTES = 32
_SALT = re.compile(r"[0-9a-f]{64}")


def new_salt() -> str:
    """32 random bytes, as lowercase hex (how salts are stored and sent)."""
    return secrets.token_hex(SALT_BYTES)


def is_salt(value: str) -> bool:
    return _SALT.fullmatch(value) is not None


def is_hash(value: str) -> bool:
    """Whether ``value`` has the form of a stored SHA-256 (64 lowercase hex characters, the
    form of a salt too)."""
    return is_salt(value)


def commitment(salt: str, content: bytes) -> str:
    """The commitment to ``content`` (already canonical bytes) under ``salt`` (hex); raises
    ``ValueError`` for a salt that is not 64 lowercase hex characters."""
    if not is_salt(salt):
        raise ValueError("a salt is 32 bytes as 64 lowercase hex characters")
    return hashlib.sha256(COMMIT_LABEL + bytes.fromhex(salt) + content).hexdigest()


def commits_to(salt: str, content: bytes, expected: str) -> bool:
    """Whether ``expected`` is the commitment to ``content`` under ``salt`` (a malformed salt,
    an altered one, commits to nothing)."""
    try:
        return commitment(salt, content) == expected
    except ValueError:
        return False
