"""Where `engram forget --match` looks in a warm log: recorded fields, not chain fields; a
damaged line or file is searched whole rather than skipped."""

from __future__ import annotations

import gzip
import json

import pytest

from services.compactor.erasure import blob_holds, line_holds

SALT = "ab" * 32
LINE = json.dumps({"iter": 3, "status": "success", "planDigest": "plan-3", "v": 2,
                   "salt": SALT, "hash": "4711" + "0" * 60, "prevHash": "c" * 64,
                   "summaryCommitment": "d" * 64, "detailDigest": "e" * 64})


def test_a_line_is_searched_in_its_recorded_fields_only() -> None:
    assert line_holds(LINE, "plan-3") and line_holds(LINE, "success")
    assert not line_holds(LINE, "4711") and not line_holds(LINE, "abab")


@pytest.mark.parametrize("name", ["Digest", "status", "iter", "Del", "summary", "fleet",
                                  "detail", "guardrails", "null"])
def test_the_names_of_fields_are_not_what_was_recorded(name: str) -> None:
    """Found by review (2026-11-29): ``--match Del`` found every line (its ``netDel``) and
    ``--match tail`` every cold snapshot (its ``detail``): with iterations erased in place,
    every iteration of the fleet."""
    line = json.dumps({**json.loads(LINE), "netDel": 1, "startTs": "2025"})
    assert not line_holds(line, name)
    snapshot = gzip.compress(json.dumps({"fleet": "fleet-a", "run": "run-1", "iter": 3,
                                         "summary": json.loads(line), "detail": {"n": 1},
                                         "guardrails": None}).encode())
    assert not blob_holds("f/r/cold/0000000003.json.gz", iter([snapshot]), name)
    recorded = gzip.compress(json.dumps({"fleet": "f", "run": "r", "iter": 3,
                                         "summary": json.loads(line),
                                         "detail": {name: 1}, "guardrails": []}).encode())
    assert blob_holds("f/r/cold/0000000003.json.gz", iter([recorded]),
                      name.casefold())  # a detail's keys are what its recorder wrote


def test_a_damaged_line_or_file_is_searched_whole() -> None:
    assert line_holds('{"iter": 3, "status": "4711 broken', "4711")
    assert line_holds('["4711"]', "4711")
    segment = [LINE.encode() + b"\n", b'{"damaged 4711\n']
    assert blob_holds("f/r/warm/segments/000001-x.jsonl", iter(segment), "4711")
    assert not blob_holds("f/r/warm/segments/000001-x.jsonl", iter(segment[:1]), "4711")
    snapshot = gzip.compress(json.dumps({"iter": 3, "summary": json.loads(LINE),
                                         "detail": {"n": 1}, "guardrails": []}).encode())
    assert not blob_holds("f/r/cold/0000000003.json.gz", iter([snapshot]), "4711")
    assert blob_holds("f/r/cold/0000000003.json.gz", iter([snapshot]), "plan-3")
    broken = gzip.compress(b'{"summary": "4711"')
    assert blob_holds("f/r/cold/0000000003.json.gz", iter([broken]), "4711")


def test_a_line_split_across_chunks_is_read_whole() -> None:
    data = (LINE + "\n" + LINE.replace("plan-3", "plan-Ünïcode") + "\n").encode()
    chunks = [data[i:i + 7] for i in range(0, len(data), 7)]
    assert blob_holds("f/r/warm/segments/000001-x.jsonl", iter(chunks), "plan-ünïcode")
    assert not blob_holds("f/r/warm/segments/000001-x.jsonl", iter(chunks), "abab")


def test_a_text_with_quotes_backslashes_or_newlines_is_found_in_a_detail() -> None:
    """Before, such a text was looked for in the detail's JSON, where it is escapes."""
    text = 'say "hi"\\ to\nbob'
    snapshot = gzip.compress(json.dumps({"fleet": "f", "run": "r", "iter": 3,
                                         "summary": json.loads(LINE),
                                         "detail": {"said": [text]},
                                         "guardrails": None}).encode())
    assert blob_holds("f/r/cold/0000000003.json.gz", iter([snapshot]), text.casefold())
