from __future__ import annotations

from dataclasses import replace

import pytest

from services.common.errors import IntegrityError, InvalidArgument
from services.shard.domain import records
from services.shard.domain.records import Record, RecordDraft


def _record(content: str = "lesson: keep writes idempotent") -> Record:
    sha = records.content_hash(content)
    return records.seal(
        Record(
            id=records.record_id("f", "r", "a", sha),
            fleet_id="f",
            run_id="r",
            agent_id="a",
            content=content,
            content_hash=sha,
            record_hash="",
            domain="insights",
            source="manual",
            importance=0.5,
            tags=("x",),
            metadata={},
            cross_refs=(),
            created_us=1,
        )
    )


def test_content_hash_is_sha256_of_utf8() -> None:
    import hashlib

    assert records.content_hash("é") == hashlib.sha256("é".encode()).hexdigest()


def test_id_depends_on_fleet_run_author_and_content() -> None:
    sha = records.content_hash("x")
    base = records.record_id("f", "r", "a", sha)
    assert base == records.record_id("f", "r", "a", sha)
    assert (
        len(
            {
                base,
                records.record_id("g", "r", "a", sha),
                records.record_id("f", "s", "a", sha),
                records.record_id("f", "r", "b", sha),
                records.record_id("f", "r", "a", records.content_hash("y")),
            }
        )
        == 5
    )


def test_sealed_record_verifies() -> None:
    records.verify(_record())


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("content", "lesson: tampered", "CONTENT_HASH_MISMATCH"),
        ("importance", 1.0, "RECORD_HASH_MISMATCH"),
        ("agent_id", "mallory", "RECORD_HASH_MISMATCH"),
        ("tags", ("y",), "RECORD_HASH_MISMATCH"),
    ],
)
def test_any_altered_field_is_caught(field: str, value: object, reason: str) -> None:
    with pytest.raises(IntegrityError) as caught:
        records.verify(replace(_record(), **{field: value}))
    assert caught.value.reason == reason
    assert caught.value.metadata["record_id"] == _record().id


@pytest.mark.parametrize(
    ("draft", "reason"),
    [
        (RecordDraft("   "), "EMPTY_CONTENT"),
        (RecordDraft("x" * (records.MAX_CONTENT_BYTES + 1)), "CONTENT_TOO_LARGE"),
        (RecordDraft("x", importance=-0.1), "IMPORTANCE_OUT_OF_RANGE"),
        (RecordDraft("x", importance=float("nan")), "IMPORTANCE_OUT_OF_RANGE"),
        (RecordDraft("x", run_id="a b"), "INVALID_RUN_ID"),
        (RecordDraft("x", tags=tuple(f"t{i}" for i in range(40))), "INVALID_TAGS"),
        (RecordDraft("x", metadata={f"k{i}": "v" for i in range(40)}), "METADATA_TOO_LARGE"),
    ],
)
def test_bad_drafts_are_refused(draft: RecordDraft, reason: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        records.normalize_draft(draft)
    assert caught.value.reason == reason


def test_normalisation_sorts_tags_and_nfc() -> None:
    draft = records.normalize_draft(RecordDraft("cafe\u0301", tags=("b", "a", "b", " ")))
    assert draft.content == "café"
    assert draft.tags == ("a", "b")
