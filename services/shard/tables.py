"""SQLAlchemy tables of the shard store; rows convert to domain objects with ``to_entity``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.errors import IntegrityError
from services.shard.domain.domains import Domain
from services.shard.domain.records import Record, Tombstone

# SQLite only autoincrements INTEGER PRIMARY KEY; Postgres gets a BIGINT identity.
SeqType = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class RecordRow(Base):
    __tablename__ = "records"

    seq: Mapped[int] = mapped_column(SeqType, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(32), unique=True)
    fleet_id: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[str] = mapped_column(String(128))
    agent_id: Mapped[str] = mapped_column(String(128))
    content: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    record_hash: Mapped[str] = mapped_column(String(64))
    domain: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(64))
    importance: Mapped[float] = mapped_column(Float)
    tags_json: Mapped[str] = mapped_column(Text)
    metadata_json: Mapped[str] = mapped_column(Text)
    cross_refs_json: Mapped[str] = mapped_column(Text)
    created_us: Mapped[int] = mapped_column(BigInteger)
    gate_decision_id: Mapped[str] = mapped_column(String(64), default="")
    format: Mapped[int] = mapped_column(Integer, default=1)
    salt: Mapped[str] = mapped_column(String(64), default="")
    body_commitment: Mapped[str] = mapped_column(String(64), default="")

    __table_args__ = (
        Index("ix_records_fleet_seq", "fleet_id", "seq"),
        Index("ix_records_fleet_run_seq", "fleet_id", "run_id", "seq"),
        Index("ix_records_fleet_domain_seq", "fleet_id", "domain", "seq"),
        Index("ix_records_content_hash", "content_hash"),
    )

    def to_entity(self) -> Record:
        return row_to_record(vars(self))


def row_to_record(row: Mapping[Any, Any]) -> Record:
    """A records row (ORM attributes or a Core mapping) as a domain record; a JSON field that
    no longer parses is DATA_LOSS naming the record (not INTERNAL)."""
    try:
        return _row_to_record(row)
    except (ValueError, TypeError) as error:  # json.JSONDecodeError is a ValueError
        raise IntegrityError(
            f"record {row['id']}: a stored JSON field no longer parses ({error})",
            reason="RECORD_FIELD_UNREADABLE", metadata={"record_id": str(row["id"])},
        ) from None


RECORD_COLUMNS = ("id", "fleet_id", "run_id", "agent_id", "content", "content_hash",
                  "record_hash", "domain", "source", "importance", "tags_json", "metadata_json",
                  "cross_refs_json", "created_us", "gate_decision_id", "format", "salt",
                  "body_commitment")
"""The records columns a domain record is made of, in :func:`columns_to_record`'s order."""


def columns_to_record(values: Sequence[Any]) -> Record:
    """A row of :data:`RECORD_COLUMNS` read by position (search's candidates) as a domain
    record; a JSON field that no longer parses is :func:`row_to_record`'s DATA_LOSS."""
    try:
        return _record(*values)
    except (ValueError, TypeError):
        return row_to_record(dict(zip(RECORD_COLUMNS, values, strict=True)))


def _row_to_record(row: Mapping[Any, Any]) -> Record:
    return _record(row["id"], row["fleet_id"], row["run_id"], row["agent_id"], row["content"],
                   row["content_hash"], row["record_hash"], row["domain"], row["source"],
                   row["importance"], row["tags_json"], row["metadata_json"],
                   row["cross_refs_json"], row["created_us"], row["gate_decision_id"],
                   row["format"], row["salt"], row["body_commitment"])


def _record(record_id: str, fleet_id: str, run_id: str, agent_id: str, content: str,
            content_hash: str, record_hash: str, domain: str, source: str, importance: float,
            tags_json: str, metadata_json: str, cross_refs_json: str, created_us: int,
            gate_decision_id: str, form: int, salt: str, body_commitment: str) -> Record:
    return Record(
        id=record_id,
        fleet_id=fleet_id,
        run_id=run_id,
        agent_id=agent_id,
        content=content,
        content_hash=content_hash,
        record_hash=record_hash,
        domain=domain,
        source=source,
        importance=importance,
        tags=_json_tuple(tags_json),
        metadata=dict(json.loads(metadata_json)) if metadata_json != "{}" else {},
        cross_refs=_json_tuple(cross_refs_json),
        created_us=created_us,
        gate_decision_id=gate_decision_id,
        format=int(form),
        salt=salt,
        body_commitment=body_commitment,
    )


def _json_tuple(stored: str) -> tuple[str, ...]:
    """A stored JSON list as a tuple; most are empty (search reads 40 records a query)."""
    return () if stored == "[]" else tuple(json.loads(stored))


def record_values(record: Record) -> dict[str, object]:
    return {
        "id": record.id,
        "fleet_id": record.fleet_id,
        "run_id": record.run_id,
        "agent_id": record.agent_id,
        "content": record.content,
        "content_hash": record.content_hash,
        "record_hash": record.record_hash,
        "domain": record.domain,
        "source": record.source,
        "importance": record.importance,
        "tags_json": json.dumps(list(record.tags)),
        "metadata_json": json.dumps(record.metadata, sort_keys=True),
        "cross_refs_json": json.dumps(list(record.cross_refs)),
        "created_us": record.created_us,
        "gate_decision_id": record.gate_decision_id,
        "format": record.format,
        "salt": record.salt,
        "body_commitment": record.body_commitment,
    }


class RecordTagRow(Base):
    __tablename__ = "record_tags"

    record_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("records.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))

    __table_args__ = (Index("ix_record_tags_fleet_tag", "fleet_id", "tag", "record_id"),)


class LinkRow(Base):
    """A cross-reference from a record to a domain or another record; read both ways."""

    __tablename__ = "links"

    source_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("records.id", ondelete="CASCADE"), primary_key=True
    )
    target_kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[str] = mapped_column(String(128))

    __table_args__ = (Index("ix_links_fleet_target", "fleet_id", "target_kind", "target"),)


class DomainRow(Base):
    __tablename__ = "domains"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    display_name: Mapped[str] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(Text)
    keywords_json: Mapped[str] = mapped_column(Text)
    usage_score: Mapped[float] = mapped_column(Float, default=0.0)
    usage_ts: Mapped[float] = mapped_column(Float, default=0.0)
    record_count: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_ts: Mapped[float] = mapped_column(Float, default=0.0)

    def to_entity(self) -> Domain:
        return row_to_domain(vars(self))


def row_to_domain(row: Mapping[Any, Any]) -> Domain:
    return Domain(
        name=row["name"],
        display_name=row["display_name"],
        description=row["description"],
        keywords=tuple(json.loads(row["keywords_json"])),
        usage_score=row["usage_score"],
        usage_ts=row["usage_ts"],
        record_count=row["record_count"],
        updated_ts=row["updated_ts"],
    )


class WriteRequestRow(Base):
    """Remembers a client's request_id so a retried write returns the first result."""

    __tablename__ = "write_requests"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    record_ids_json: Mapped[str] = mapped_column(Text)
    created_us: Mapped[int] = mapped_column(BigInteger)


class CompactionRow(Base):
    """An original record covered by a summary record (memory compaction)."""

    __tablename__ = "compactions"

    original_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    summary_id: Mapped[str] = mapped_column(String(32))
    fleet_id: Mapped[str] = mapped_column(String(128))
    original_hash: Mapped[str] = mapped_column(String(64))
    created_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_compactions_fleet_summary", "fleet_id", "summary_id"),)


class RecordVectorRow(Base):
    """A record's embedding (float32 little-endian bytes), kept so a restart re-embeds nothing."""

    __tablename__ = "record_vectors"

    record_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("records.id", ondelete="CASCADE"), primary_key=True
    )
    fleet_id: Mapped[str] = mapped_column(String(128))
    record_seq: Mapped[int] = mapped_column(BigInteger)
    model: Mapped[str] = mapped_column(String(64))
    vector: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index("ix_record_vectors_seq", "record_seq"),)


class FleetSecretRow(Base):
    """A fleet's key for :func:`write_key` (a retried write finds its record by it)."""

    __tablename__ = "fleet_secrets"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    secret: Mapped[str] = mapped_column(String(64))


class WriteKeyRow(Base):
    """Keyed digest of (run, author, content) -> the format-2 record it landed on; deleted
    with the record on erasure, so nothing kept ties the id to its text."""

    __tablename__ = "write_keys"

    fleet_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    record_id: Mapped[str] = mapped_column(String(32))

    __table_args__ = (Index("ix_write_keys_record", "record_id"),)


class TombstoneRow(Base):
    """An erased record: its structural fields and leaf hash; no content, tags, metadata,
    salt or content hash."""

    __tablename__ = "record_tombstones"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    fleet_id: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[str] = mapped_column(String(128))
    agent_id: Mapped[str] = mapped_column(String(128))
    format: Mapped[int] = mapped_column(Integer)
    body_commitment: Mapped[str] = mapped_column(String(64))
    record_hash: Mapped[str] = mapped_column(String(64))
    domain: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(64))
    importance: Mapped[float] = mapped_column(Float)
    cross_refs_json: Mapped[str] = mapped_column(Text)
    created_us: Mapped[int] = mapped_column(BigInteger)
    gate_decision_id: Mapped[str] = mapped_column(String(64))
    erasure_id: Mapped[str] = mapped_column(String(64))
    erased_us: Mapped[int] = mapped_column(BigInteger)
    erased_by: Mapped[str] = mapped_column(String(128))

    __table_args__ = (Index("ix_record_tombstones_fleet_seq", "fleet_id", "seq"),
                      Index("ix_record_tombstones_erasure", "erasure_id"),
                      Index("ix_record_tombstones_seq", "seq"))  # a write's commit asks max

    def to_entity(self) -> Tombstone:
        return Tombstone(
            id=self.id, fleet_id=self.fleet_id, run_id=self.run_id, agent_id=self.agent_id,
            format=self.format, body_commitment=self.body_commitment,
            record_hash=self.record_hash, domain=self.domain, source=self.source,
            importance=self.importance, cross_refs=tuple(json.loads(self.cross_refs_json)),
            created_us=self.created_us, gate_decision_id=self.gate_decision_id,
            erasure_id=self.erasure_id, erased_us=self.erased_us, erased_by=self.erased_by)


def tombstone_values(tombstone: Tombstone, seq: int) -> dict[str, object]:
    """``tombstone`` as a ``record_tombstones`` row (``seq``: the erased record's)."""
    return {
        "id": tombstone.id, "seq": seq, "fleet_id": tombstone.fleet_id,
        "run_id": tombstone.run_id, "agent_id": tombstone.agent_id,
        "format": tombstone.format, "body_commitment": tombstone.body_commitment,
        "record_hash": tombstone.record_hash, "domain": tombstone.domain,
        "source": tombstone.source, "importance": tombstone.importance,
        "cross_refs_json": json.dumps(list(tombstone.cross_refs)),
        "created_us": tombstone.created_us, "gate_decision_id": tombstone.gate_decision_id,
        "erasure_id": tombstone.erasure_id, "erased_us": tombstone.erased_us,
        "erased_by": tombstone.erased_by,
    }


# Core table handles for the hot paths (typed as Table, which ``__table__`` is not).
RECORDS = cast(Table, RecordRow.__table__)
RECORD_TAGS = cast(Table, RecordTagRow.__table__)
LINKS = cast(Table, LinkRow.__table__)
DOMAINS = cast(Table, DomainRow.__table__)
RECORD_VECTORS = cast(Table, RecordVectorRow.__table__)
WRITE_KEYS = cast(Table, WriteKeyRow.__table__)
