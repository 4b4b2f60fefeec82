"""Format-2 warm lines (salted commitments, docs/erasure.md): a line's hash chains commitments
of its summary fields and detail under a salt, not the content; a change to content, salt or
commitment is found; format-1 lines (recorded before) verify as they did, and a log goes on
from a format-1 head in format 2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from services.common.blobstore.file import FileBlobStore
from services.common.canonical import canonical_json
from services.common.commitment import commitment, is_salt
from services.common.errors import IntegrityError
from services.compactor.domain.warm_chain import (
    ChainWalker,
    WarmLine,
    canonical_detail_content,
    detail_digest,
    genesis_hash,
)
from services.compactor.service import ImportedIteration, IterationLog
from tests.unit.compactor.support import LogFactory, make_iteration

F, R = "fleet-a", "run-f"
SUMMARY = ("planDigest", "parentDigest", "startTs", "endTs", "filesTouched", "netAdd", "netDel",
           "riskScore", "status")


def _format1_line(n: int, prev: str) -> WarmLine:
    """Iteration ``n`` as the compactor chained it before format 2."""
    return WarmLine.chained(make_iteration(n).validated(), n, prev)


def test_a_recorded_line_is_format_2_and_hashes_commitments_as_documented(
        make_log: LogFactory) -> None:
    log = make_log()
    item = make_iteration(1).validated()
    line = log.record(F, R, item).line
    data = json.loads(line.text())
    assert data["v"] == 2 and line.format == 2 and is_salt(line.salt)
    content = canonical_detail_content(item.detail_json, item.guardrails_json)
    assert line.detail_digest == commitment(line.salt, content)
    assert line.detail_digest != detail_digest(item.detail_json, item.guardrails_json)
    assert line.summary_commitment == commitment(
        line.salt, canonical_json({k: data[k] for k in SUMMARY}).encode())
    assert line.hash == hashlib.sha256(canonical_json({
        "v": 2, "iter": 1, "prevHash": genesis_hash(F, R),
        "summaryCommitment": line.summary_commitment,
        "detailDigest": line.detail_digest}).encode()).hexdigest()
    assert line.intact() and line.commits_detail(item.detail_json, item.guardrails_json)
    # another salt, the same content: other commitments, another hash
    again = log.record(F, "run-g", item).line
    assert again.salt != line.salt and again.hash != line.hash
    assert log.verify(F, R).ok


def test_the_hash_depends_on_the_commitment_not_the_content() -> None:
    item = make_iteration(3).validated()
    line = WarmLine.chained(item, 1, genesis_hash(F, R), salt="ab" * 32)
    changed = json.loads(line.text())
    changed["status"] = "failed"  # content changed, commitment kept
    altered = WarmLine.from_dict(changed)
    assert altered.computed_hash() == line.hash  # the hash never saw the content...
    assert not altered.intact()  # ...the commitment did


@pytest.mark.parametrize("field, value", [
    ("status", "failed"), ("riskScore", 0.75), ("planDigest", "plan-x"), ("startTs", "2025"),
    ("salt", "cd" * 32), ("salt", "AB" * 32), ("salt", "ab" * 31),
    ("summaryCommitment", "0" * 64), ("detailDigest", "0" * 64), ("hash", "0" * 64),
    ("prevHash", "0" * 64), ("iter", 2)])
def test_a_changed_field_of_a_format_2_line_is_found(field: str, value: object) -> None:
    line = WarmLine.chained(make_iteration(1).validated(), 1, genesis_hash(F, R),
                            salt="ab" * 32)
    data = json.loads(line.text())
    assert data[field] != value
    walker = ChainWalker(genesis_hash(F, R))
    walker.feed_text("line", canonical_json({**data, field: value}))
    assert walker.problems, field


@pytest.mark.parametrize("change", [{"v": 3}, {"v": "2"}, {"v": True}, {"v": 1}])
def test_an_unknown_or_mixed_format_is_unreadable(change: dict[str, object]) -> None:
    line = WarmLine.chained(make_iteration(1).validated(), 1, genesis_hash(F, R),
                            salt="ab" * 32)
    with pytest.raises(ValueError):
        WarmLine.parse(canonical_json({**json.loads(line.text()), **change}))
    old = _format1_line(1, genesis_hash(F, R))
    with pytest.raises(ValueError):  # a format-1 line carries no salt
        WarmLine.parse(canonical_json({**json.loads(old.text()), "salt": "ab" * 32}))


def test_a_format_1_line_verifies_as_it_always_did() -> None:
    item = make_iteration(1).validated()
    old = _format1_line(1, genesis_hash(F, R))
    data = json.loads(old.text())
    assert "v" not in data and "salt" not in data and old.format == 1
    assert old.detail_digest == hashlib.sha256(
        canonical_detail_content(item.detail_json, item.guardrails_json)).hexdigest()
    body = {k: v for k, v in data.items() if k != "hash"}
    assert old.hash == hashlib.sha256(canonical_json(body).encode()).hexdigest()
    parsed = WarmLine.parse(old.text())
    assert parsed == old and parsed.intact()
    assert parsed.commits_detail(item.detail_json, item.guardrails_json)
    assert not WarmLine.from_dict({**data, "status": "failed"}).intact()


def test_a_log_goes_on_from_a_format_1_head(make_log: LogFactory,
                                            blobs: FileBlobStore) -> None:
    """Format-1 lines (as an older compactor recorded them; imported here) stay format 1, the
    log goes on in format 2 from their head, across sealed segments and snapshots; verify,
    reconstruct and a tampered line of either format behave as before."""
    log = make_log(rotate_bytes=2000, snapshot_every=5, hot_size=4)
    prev, old = genesis_hash(F, R), []
    for n in range(1, 8):
        line = _format1_line(n, prev)
        item = make_iteration(n).validated()
        old.append(ImportedIteration(line, item.detail_json, item.guardrails_json))
        prev = line.hash
    assert log.import_iterations(F, R, old) == (7, 0)
    new = [log.record(F, R, make_iteration(n)).line for n in range(8, 21)]
    assert new[0].format == 2 and new[0].prev_hash == old[-1].line.hash
    lines = log.summaries(F, R, 1, 20)
    assert [x.format for x in lines] == [1] * 7 + [2] * 13
    assert lines[:7] == [item.line for item in old]  # never rewritten
    assert len(log.repo.sealed_segments(F, R)) >= 2
    report = log.verify(F, R)
    assert report.ok and report.head_hash == new[-1].hash, report
    for n in range(1, 21):
        view = log.reconstruct(F, R, n)
        if view.detail_json:
            item = make_iteration(view.base_iteration).validated()
            assert view.detail_json == item.detail_json
            assert lines[view.base_iteration - 1].commits_detail(view.detail_json,
                                                                 view.guardrails_json)
    assert log.reconstruct(F, R, 5).summary.format == 1  # its cold snapshot, format 1
    assert log.reconstruct(F, R, 10).summary.format == 2


def _first_sealed(log: IterationLog, blobs: FileBlobStore) -> Path:
    return blobs.root / log.repo.sealed_segments(F, R)[0].key


@pytest.mark.parametrize("field", ["salt", "summaryCommitment", "status", "detailDigest"])
def test_verify_finds_a_changed_format_2_field_in_a_segment_and_in_the_database(
        make_log: LogFactory, blobs: FileBlobStore, field: str) -> None:
    log = make_log(rotate_bytes=2500, snapshot_every=5)
    for n in range(1, 16):
        log.record(F, R, make_iteration(n))
    segment = _first_sealed(log, blobs)
    texts = segment.read_text().splitlines()
    data = json.loads(texts[1])
    data[field] = "failed" if field == "status" else "".join(reversed(data[field]))
    texts[1] = canonical_json(data)
    segment.write_text("\n".join(texts) + "\n")
    last = log.last_iteration(F, R)
    with log.repo.db.engine.begin() as conn:
        stored = conn.execute(text("SELECT line FROM compactor_warm_lines WHERE iteration = "
                                   ":n"), {"n": last}).scalar_one()
        line = json.loads(stored)
        line[field] = "failed" if field == "status" else "".join(reversed(line[field]))
        conn.execute(text("UPDATE compactor_warm_lines SET line = :line WHERE iteration = :n"),
                     {"line": canonical_json(line), "n": last})
    found = " | ".join(f"{loc}: {detail}" for loc, detail in log.verify(F, R).problems)
    assert "segment 1 line 2" in found and f"active line {last}" in found, found


def test_a_detail_that_does_not_commit_under_the_salt_is_data_loss(
        make_log: LogFactory) -> None:
    log = make_log(hot_size=4)
    for n in range(1, 4):
        log.record(F, R, make_iteration(n))
    with log.repo.db.engine.begin() as conn:
        conn.execute(text("UPDATE compactor_hot SET detail_json = '{\"context\":\"x\"}' "
                          "WHERE iteration = 2"))
    with pytest.raises(IntegrityError) as failure:
        log.reconstruct(F, R, 2)
    assert failure.value.reason == "DETAIL_TAMPERED"
    assert log.reconstruct(F, R, 3).detail_json
