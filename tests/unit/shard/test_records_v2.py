"""Format-2 records (docs/erasure.md): a salted commitment covers content, tags and metadata;
record_hash covers the structural fields and that commitment, so a tombstone (no content,
tags, metadata or salt) still re-derives it, and nothing kept confirms a guess."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from services.common.commitment import new_salt
from services.common.errors import IntegrityError
from services.shard.domain import records
from services.shard.domain.records import Record, Tombstone


def _v2(content: str = "the door code is 4-8-15", **fields: object) -> Record:
    salt = new_salt()
    base = Record(id=records.new_record_id(), fleet_id="f", run_id="r", agent_id="a",
                  content=content, content_hash=records.content_hash(content), record_hash="",
                  domain="insights", source="manual", importance=0.5, tags=("x",),
                  metadata={"k": "v"}, cross_refs=(), created_us=7, gate_decision_id="dec_1",
                  format=2, salt=salt)
    return records.seal(replace(base, **fields))  # type: ignore[arg-type]


def _tombstone(record: Record, **fields: object) -> Tombstone:
    stone = Tombstone(
        id=record.id, fleet_id=record.fleet_id, run_id=record.run_id, agent_id=record.agent_id,
        format=record.format, body_commitment=record.body_commitment,
        record_hash=record.record_hash, domain=record.domain, source=record.source,
        importance=record.importance, cross_refs=record.cross_refs,
        created_us=record.created_us, gate_decision_id=record.gate_decision_id,
        erasure_id="era_1", erased_us=9, erased_by="op")
    return replace(stone, **fields)  # type: ignore[arg-type]


def test_a_sealed_v2_record_verifies_and_its_gate_hash_is_the_commitment() -> None:
    record = _v2()
    records.verify(record)
    assert records.gate_hash(record) == record.body_commitment != record.content_hash


@pytest.mark.parametrize("field,value", [
    ("content", "the door code is 4-8-16"), ("tags", ("y",)), ("metadata", {"k": "w"}),
    ("salt", "00" * 32), ("salt", "not hex"), ("importance", 0.9), ("agent_id", "b"),
    ("id", "f" * 32), ("gate_decision_id", "dec_2"),
])
def test_any_edit_of_a_v2_record_fails_verification(field: str, value: object) -> None:
    record = _v2()
    edited = replace(record, **{field: value})  # type: ignore[arg-type]
    if field == "content":
        edited = replace(edited, content_hash=records.content_hash(str(value)))
    with pytest.raises(IntegrityError):
        records.verify(edited)


def test_a_tombstone_re_derives_its_leaf_and_an_edited_one_does_not() -> None:
    record = _v2()
    assert records.verify_tombstone(_tombstone(record))
    for field, value in (("agent_id", "b"), ("importance", 0.1), ("body_commitment", "0" * 64),
                         ("created_us", 8), ("cross_refs", ("domain:x",))):
        assert not records.verify_tombstone(_tombstone(record, **{field: value}))


def test_nothing_a_tombstone_keeps_confirms_a_guess_of_the_text() -> None:
    """Without the salt, the commitment of the right guess is unrelated to the kept one."""
    record = _v2()
    stone = _tombstone(record)
    guess = record.content
    plain = hashlib.sha256(guess.encode()).hexdigest()
    kept = " ".join(str(v) for v in vars(stone).values())
    assert plain not in kept
    assert record.id != records.record_id("f", "r", "a", plain)  # ids are random now
    unsalted = records.body_commitment("00" * 32, guess, record.tags, record.metadata)
    assert unsalted != stone.body_commitment


def test_write_keys_are_keyed_by_the_fleet_secret() -> None:
    one = records.write_key(b"a" * 32, "r", "agent", "text")
    assert one == records.write_key(b"a" * 32, "r", "agent", "text")
    assert one != records.write_key(b"b" * 32, "r", "agent", "text")
    assert one != records.write_key(b"a" * 32, "r", "agent", "text!")


def test_a_write_of_a_format_1_records_text_lands_on_it(tmp_path: object) -> None:
    """Records written before format 2 keep their derived ids, and the same text by the same
    author in the same run still finds them (a retry across the upgrade stores nothing new);
    new text gets a random id with a write key."""
    from pathlib import Path

    from services.common.db import Database
    from services.common.tokens import Principal
    from services.shard.domain.records import RecordDraft
    from services.shard.server import MIGRATIONS
    from services.shard.service import ShardService

    assert isinstance(tmp_path, Path)
    database = Database(f"sqlite:///{tmp_path / 'shard.db'}")
    database.upgrade(MIGRATIONS)
    text = "written before the upgrade"
    sha = records.content_hash(text)
    old = records.seal(Record(
        id=records.record_id("f", "r", "a", sha), fleet_id="f", run_id="r", agent_id="a",
        content=text, content_hash=sha, record_hash="", domain="insights", source="manual",
        importance=0.5, tags=(), metadata={}, cross_refs=(), created_us=1))
    service = ShardService(database)
    with database.session() as session:
        service.repo.insert(session, [old])
    who = Principal(agent_id="a", fleet_id="f", roles=frozenset({"agent"}))
    again = service.write(who, [RecordDraft(text, run_id="r")])[0]
    assert (again.record.id, again.created, again.record.format) == (old.id, False, 1)
    fresh = service.write(who, [RecordDraft("written after it", run_id="r")])[0]
    assert fresh.created and fresh.record.format == 2
    assert service.write(who, [RecordDraft("written after it", run_id="r")])[0].record.id \
        == fresh.record.id
