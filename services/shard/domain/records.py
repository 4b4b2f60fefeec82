"""Memory records: validation, content addressing and integrity (seed 000).

``content_hash`` is SHA-256 of the UTF-8 content (the seed's definition).

Format 1 (records written before erasure support): ``record_hash`` is SHA-256 of
the canonical JSON of every immutable field, the text through its hash, and the
id derives from fleet, run, author and content hash.

Format 2 (every new record; docs/erasure.md): 32 random bytes, ``salt``, are kept
beside the record; ``body_commitment`` = SHA-256 over a label, the salt and the
canonical content, tags and metadata; ``record_hash`` covers the structural
fields and that commitment only; the id is random (a retried write finds it
through the keyed digest :func:`write_key`). Erasing a format-2 record deletes
its content, tags, metadata, salt and ``content_hash`` and keeps the rest: the
tombstone still re-derives its ``record_hash`` (a Merkle leaf stays stable), and
nothing kept confirms a guess of the erased text.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import unicodedata
from dataclasses import dataclass, field, replace

from services.common.canonical import canonical_bytes
from services.common.commitment import commitment as salted_commitment
from services.common.errors import IntegrityError, InvalidArgument
from services.common.limits import check_limit
from services.common.settings import LIMIT_DEFAULTS, LimitsSettings
from services.common.tokens import validate_identifier

MAX_CONTENT_BYTES = LIMIT_DEFAULTS.content_bytes
"""The default content limit; a compaction summary is cut to it."""
MAX_SOURCE_LEN = 64
DEFAULT_IMPORTANCE = 0.5
ID_HEX_LEN = 32
_RECORD_ID = re.compile(f"[0-9a-f]{{{ID_HEX_LEN}}}")


@dataclass(frozen=True)
class RecordDraft:
    """What a caller asks to store, before routing and addressing."""

    content: str
    run_id: str = ""
    domain: str = ""
    source: str = "manual"
    importance: float = DEFAULT_IMPORTANCE
    tags: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Record:
    id: str
    fleet_id: str
    run_id: str
    agent_id: str
    content: str
    content_hash: str
    record_hash: str
    domain: str
    source: str
    importance: float
    tags: tuple[str, ...]
    metadata: dict[str, str]
    cross_refs: tuple[str, ...]
    created_us: int
    """Creation time, microseconds since the Unix epoch (UTC)."""
    gate_decision_id: str = ""
    format: int = 1
    salt: str = ""
    """Format 2: 64 hex digits, deleted with the content on erasure."""
    body_commitment: str = ""


@dataclass(frozen=True)
class Tombstone:
    """What stays of an erased record: its structural fields and leaf hash, no content."""

    id: str
    fleet_id: str
    run_id: str
    agent_id: str
    format: int
    body_commitment: str
    record_hash: str
    domain: str
    source: str
    importance: float
    cross_refs: tuple[str, ...]
    created_us: int
    gate_decision_id: str
    erasure_id: str
    erased_us: int
    erased_by: str


FORMAT = 2
"""The format of records written now."""
def is_record_id(value: str) -> bool:
    """``ID_HEX_LEN`` lowercase hex digits, as every record id is."""
    return _RECORD_ID.fullmatch(value) is not None


def tombstone_of(record: Record, erasure_id: str, erased_us: int, erased_by: str) -> Tombstone:
    """What stays of ``record`` once the erasure ``erasure_id`` erased it."""
    return Tombstone(
        id=record.id, fleet_id=record.fleet_id, run_id=record.run_id, agent_id=record.agent_id,
        format=record.format, body_commitment=record.body_commitment,
        record_hash=record.record_hash, domain=record.domain, source=record.source,
        importance=record.importance, cross_refs=record.cross_refs,
        created_us=record.created_us, gate_decision_id=record.gate_decision_id,
        erasure_id=erasure_id, erased_us=erased_us, erased_by=erased_by)


def new_record_id() -> str:
    return secrets.token_hex(ID_HEX_LEN // 2)


def body_commitment(salt: str, content: str, tags: tuple[str, ...],
                    metadata: dict[str, str]) -> str:
    """A salted commitment to what erasure deletes: without the salt it confirms no guess."""
    return salted_commitment(salt, canonical_bytes({
        "content": content, "tags": sorted(tags), "metadata": dict(sorted(metadata.items()))}))


def write_key(fleet_secret: bytes, run_id: str, agent_id: str, content: str) -> str:
    """The keyed digest a retried write finds its record by (deleted on erasure)."""
    material = "\x1f".join(("engram-write-v2", run_id, agent_id, content)).encode("utf-8")
    return hmac.new(fleet_secret, material, hashlib.sha256).hexdigest()


def content_hash(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def record_id(fleet_id: str, run_id: str, agent_id: str, content_sha: str) -> str:
    material = "\x1f".join(("engram-record-v1", fleet_id, run_id, agent_id, content_sha))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:ID_HEX_LEN]


def canonical_fields(record: Record, content_sha: str) -> bytes:
    """Every immutable field except the text itself, which enters through its hash."""
    body = {
        "id": record.id,
        "fleet_id": record.fleet_id,
        "run_id": record.run_id,
        "agent_id": record.agent_id,
        "content_hash": content_sha,
        "domain": record.domain,
        "source": record.source,
        "importance": repr(float(record.importance)),
        "tags": sorted(record.tags),
        "metadata": dict(sorted(record.metadata.items())),
        "cross_refs": sorted(record.cross_refs),
        "created_us": record.created_us,
        "gate_decision_id": record.gate_decision_id,
    }
    return canonical_bytes(body)


def structural_fields(item: Record | Tombstone, commitment: str) -> bytes:
    """Format 2: what ``record_hash`` covers (the body enters through its commitment)."""
    return canonical_bytes({
        "v": 2,
        "id": item.id,
        "fleet_id": item.fleet_id,
        "run_id": item.run_id,
        "agent_id": item.agent_id,
        "body_commitment": commitment,
        "domain": item.domain,
        "source": item.source,
        "importance": repr(float(item.importance)),
        "cross_refs": sorted(item.cross_refs),
        "created_us": item.created_us,
        "gate_decision_id": item.gate_decision_id,
    })


def seal(record: Record) -> Record:
    """Fill in ``record_hash`` (and, format 2, ``body_commitment`` from the salt);
    ``content_hash`` must already be the hash of the content."""
    if record.format == 2:
        commitment = body_commitment(record.salt, record.content, record.tags, record.metadata)
        digest = hashlib.sha256(structural_fields(record, commitment)).hexdigest()
        return replace(record, body_commitment=commitment, record_hash=digest)
    digest = hashlib.sha256(canonical_fields(record, record.content_hash)).hexdigest()
    return replace(record, record_hash=digest)


def gate_hash(record: Record) -> str:
    """What governance's chain holds for the record: never a plain hash of format-2 content."""
    return record.body_commitment if record.format == 2 else record.content_hash


def verify_tombstone(tombstone: Tombstone) -> bool:
    """A format-2 tombstone's kept fields re-derive its leaf hash (False: they were altered).
    A format-1 tombstone cannot be re-derived (its hash covered the erased text): True."""
    if tombstone.format != 2:
        return True
    actual = hashlib.sha256(structural_fields(tombstone, tombstone.body_commitment)).hexdigest()
    return actual == tombstone.record_hash


def verify(record: Record) -> None:
    """Raise :class:`IntegrityError` naming the record when a stored field no longer matches."""
    actual_content = content_hash(record.content)
    if actual_content != record.content_hash:
        raise IntegrityError(
            f"record {record.id}: content no longer matches its content_hash "
            f"(stored {record.content_hash[:12]}…, recomputed {actual_content[:12]}…)",
            reason="CONTENT_HASH_MISMATCH",
            metadata={
                "record_id": record.id,
                "expected": record.content_hash,
                "actual": actual_content,
            },
        )
    if record.format == 2:
        try:
            commitment = body_commitment(record.salt, record.content, record.tags,
                                         record.metadata)
        except ValueError:  # a salt that is no longer hex
            commitment = ""
        if commitment != record.body_commitment:
            raise IntegrityError(
                f"record {record.id}: content, tags or metadata no longer match its "
                "body_commitment", reason="BODY_COMMITMENT_MISMATCH",
                metadata={"record_id": record.id})
        covered = structural_fields(record, commitment)
    else:
        covered = canonical_fields(record, actual_content)
    actual_record = hashlib.sha256(covered).hexdigest()
    if actual_record != record.record_hash:
        raise IntegrityError(
            f"record {record.id}: a stored field was altered (record_hash mismatch)",
            reason="RECORD_HASH_MISMATCH",
            metadata={
                "record_id": record.id,
                "expected": record.record_hash,
                "actual": actual_record,
            },
        )
    if record.format != 2 and record.id != record_id(record.fleet_id, record.run_id,
                                                     record.agent_id, actual_content):
        raise IntegrityError(
            f"record {record.id}: id does not derive from its fleet, run, author and content",
            reason="RECORD_ID_MISMATCH",
            metadata={"record_id": record.id},
        )


def normalize_draft(draft: RecordDraft, limits: LimitsSettings = LIMIT_DEFAULTS) -> RecordDraft:
    """Validate a draft; return it normalised (NFC content, sorted unique tags)."""
    content = unicodedata.normalize("NFC", draft.content)
    if not content.strip():
        raise InvalidArgument("content is empty; a memory needs some text", reason="EMPTY_CONTENT")
    check_limit("content (store large payloads as artifacts and reference them)",
                len(content.encode("utf-8")), limits.content_bytes, "ENGRAM_LIMITS_CONTENT_BYTES",
                "bytes", reason="CONTENT_TOO_LARGE")
    importance = float(draft.importance)
    if math.isnan(importance) or not 0.0 <= importance <= 1.0:
        raise InvalidArgument(
            f"importance must be between 0 and 1, got {draft.importance}",
            reason="IMPORTANCE_OUT_OF_RANGE",
        )
    if draft.run_id:
        validate_run_id(draft.run_id)
    tags = tuple(sorted({t.strip() for t in draft.tags if t.strip()}))
    check_tags("tags", tags, limits.tags_per_record, "ENGRAM_LIMITS_TAGS_PER_RECORD", limits,
               reason="INVALID_TAGS")
    source = draft.source.strip() or "manual"
    if len(source) > MAX_SOURCE_LEN:
        raise InvalidArgument(
            f"source is longer than {MAX_SOURCE_LEN} characters", reason="INVALID_SOURCE"
        )
    check_limit("metadata", len(draft.metadata), limits.metadata_entries,
                "ENGRAM_LIMITS_METADATA_ENTRIES", "entries", reason="METADATA_TOO_LARGE")
    check_limit("metadata (keys and values)",
                sum(len(k.encode()) + len(v.encode()) for k, v in draft.metadata.items()),
                limits.metadata_bytes, "ENGRAM_LIMITS_METADATA_BYTES", "bytes",
                reason="METADATA_TOO_LARGE")
    return replace(
        draft,
        content=content,
        importance=importance,
        tags=tags,
        source=source,
        domain=draft.domain.strip().lower(),
    )


def validate_run_id(run_id: str) -> str:
    """A run id is an identifier (no spaces, no control characters, not ``..``)."""
    try:
        return validate_identifier("run_id", run_id)
    except InvalidArgument as error:
        raise InvalidArgument(error.message, reason="INVALID_RUN_ID") from None


def check_tags(what: str, tags: tuple[str, ...], most: int, setting: str,
               limits: LimitsSettings, *, reason: str | None = None) -> None:
    """At most ``most`` tags, each at most ``limits.tag_chars`` characters."""
    check_limit(what, len(tags), most, setting, "tags", reason=reason)
    longest = max((len(t) for t in tags), default=0)
    check_limit(f"a tag in {what}", longest, limits.tag_chars, "ENGRAM_LIMITS_TAG_CHARS",
                "characters", reason=reason)
