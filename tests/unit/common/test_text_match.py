"""What engram forget --match finds: folded text, JSON with escapes, bytes across chunks."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument
from services.common.text_match import bytes_hold, holds, json_holds, needle_of


def test_text_and_json_are_searched_folded_and_decoded() -> None:
    needle = needle_of("Jane Müller")
    assert holds("met JANE MÜLLER today", needle)
    assert json_holds('{"who": "Jane M\\u00fcller"}', needle)  # stored with an escape
    assert not json_holds('{"who": "Jane Miller"}', needle)
    assert not json_holds("not json, no match", needle)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_bytes_are_found_across_chunk_boundaries(size: int) -> None:
    data = b"x" * 100 + b"The Launch CODE" + b"y" * 50
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    assert bytes_hold(chunks, needle_of("launch code"))
    assert not bytes_hold(chunks, needle_of("launch codes"))


@pytest.mark.parametrize("bad", ["", "   ", "x" * 1001])
def test_an_empty_or_huge_match_is_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        needle_of(bad)


def test_bytes_are_case_folded_as_text_beyond_ascii() -> None:
    # Bytes were lowercased for ASCII letters only: `forget --match "MÜLLER"` missed the
    # name in artifact blobs and cold snapshots, which then kept it after the erasure.
    blob = "Kunde: MÜLLER, Straße 5".encode()
    assert bytes_hold([blob], needle_of("Müller"))
    assert bytes_hold([blob], needle_of("STRASSE 5"))
    cut = blob.index("Ü".encode()) + 1  # a two-byte letter split across chunks
    assert bytes_hold([blob[:cut], blob[cut:]], needle_of("müller"))
    assert bytes_hold([bytes([b]) for b in blob], needle_of("straße 5"))
    assert not bytes_hold([blob], needle_of("Mueller"))
    assert not bytes_hold([b"\xff\xfe M\xc3"], needle_of("m\u00fc"))


def test_a_text_with_quotes_backslashes_or_newlines_is_found_in_json() -> None:
    """Before, the JSON was searched as stored and re-encoded, where such characters are
    escapes: `forget --match 'say "hi"'` found no event payload or snapshot state holding it."""
    text = 'say "hi"\\ to\nbob'
    stored = json.dumps({"said": [text], "key \"q\"": 1})
    assert json_holds(stored, needle_of(text)) and json_holds(stored, needle_of('key "q"'))
    assert not json_holds(stored, needle_of('say "ho"'))
