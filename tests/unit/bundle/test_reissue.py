"""The re-addressing ``--reissue-ids`` applies (engram/bundle/reissue.py), item by item: a
compaction summary's ``replaces`` follows its originals' new ids and hashes, a tombstone's
references follow, the same key gives the same items, and a key file is made or refused."""

from __future__ import annotations

import json
import stat
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.bundle.format import BundleError, iteration_row, parse_row
from engram.bundle.reissue import Reissue, load_key, make_key
from engram.governance.v1 import governance_service_pb2 as gpb
from services.artifacts.domain import chain
from services.compactor.domain.warm_chain import IterationInput, WarmLine, genesis_hash
from services.compactor.servicer import summary_pb
from services.shard.domain import records
from services.shard.domain.compaction import SUMMARY_SOURCE
from services.shard.servicer import (
    record_from_proto,
    record_to_proto,
    tombstone_from_proto,
    tombstone_to_proto,
)

FLEET = "fleet-a"
KEY = bytes(range(32))


def legacy(content: str, created_us: int, refs: tuple[str, ...] = ()) -> records.Record:
    sha = records.content_hash(content)
    return records.seal(records.Record(
        id=records.record_id(FLEET, "", "a", sha), fleet_id=FLEET, run_id="", agent_id="a",
        content=content, content_hash=sha, record_hash="", domain="insights", source="manual",
        importance=0.5, tags=(), metadata={}, cross_refs=refs, created_us=created_us))


def current(record: records.Record, **changes: Any) -> records.Record:
    """``record`` written as format 2 (a salt, a random id unless given)."""
    fields = {"id": records.new_record_id(), "format": 2, "salt": "ab" * 32, **changes}
    return records.seal(records.Record(**{**record.__dict__, **fields}))


class Rows:
    """A bundle's parts as BundleReader.rows gives them."""

    def __init__(self, **parts: list[Any]) -> None:
        self.parts = {kind: [m if isinstance(m, dict)
                             else MessageToDict(m, preserving_proto_field_name=True)
                             for m in items]
                      for kind, items in parts.items()}

    def rows(self, kind: str) -> list[dict[str, Any]]:
        return self.parts.get(kind, [])

    def messages(self, kind: str, message: type[Any]) -> list[Any]:
        return [parse_row(row, message(), kind) for row in self.rows(kind)]


def test_a_summary_names_its_re_addressed_originals_by_their_new_ids_and_hashes() -> None:
    original = legacy("retries need idempotency keys", 1_000)
    replaced = json.dumps([{"id": original.id, "record_hash": original.record_hash}],
                          separators=(",", ":"))
    summary = current(legacy("summary of one lesson", 2_000), source=SUMMARY_SOURCE,
                      metadata={"replaces": replaced})
    reissue = Reissue(KEY)
    reissue.plan(Rows(records=[record_to_proto(original), record_to_proto(summary)]))  # type: ignore[arg-type]
    new_original = record_from_proto(reissue.record(record_to_proto(original)))
    new_summary = record_from_proto(reissue.record(record_to_proto(summary)))
    assert (new_original.format, new_original.id) == (2, reissue.ids[original.id])
    assert new_original.id != original.id and records.is_record_id(new_original.id)
    assert json.loads(new_summary.metadata["replaces"]) == [
        {"id": new_original.id, "record_hash": new_original.record_hash}]
    assert new_summary.id == summary.id  # a format-2 record keeps its id and salt
    for record in (new_original, new_summary):
        records.verify(record)  # re-hashes under its salt
    # Its decision holds the commitment the summary has now.
    decided = reissue.decision(gpb.GateDecision(record_id=summary.id,
                                                content_hash=summary.body_commitment))
    assert decided.content_hash == new_summary.body_commitment != summary.body_commitment


def test_a_tombstone_is_re_addressed_and_its_references_follow() -> None:
    target = legacy("the vendor's number", 1_000)
    erased = legacy(f"see shard:{target.id} for it", 2_000, (f"record:{target.id}",))
    tombstone = records.tombstone_of(erased, "era_" + "0" * 28, 3_000, "op")
    reissue = Reissue(KEY)
    reissue.plan(Rows(records=[record_to_proto(target)],  # type: ignore[arg-type]
                      tombstones=[tombstone_to_proto(tombstone)]))
    new = reissue.tombstone(tombstone_to_proto(tombstone))
    assert (new.id, new.format) == (reissue.ids[erased.id], 2)
    assert list(new.cross_refs) == [f"record:{reissue.ids[target.id]}"]
    assert new.record_hash != tombstone.record_hash
    assert records.verify_tombstone(tombstone_from_proto(new))
    listed = reissue.erasure(gpb.Erasure(selector_kind="record", selector_value=erased.id,
                                         items=[gpb.ErasedItem(kind="record", id=erased.id,
                                                               leaf_hash=tombstone.record_hash)]))
    assert (listed.selector_value, listed.items[0].id, listed.items[0].leaf_hash) == (
        new.id, new.id, new.record_hash)


def test_the_same_key_gives_the_same_items_and_another_key_others() -> None:
    record = record_to_proto(legacy("a lesson", 1_000))
    made = []
    for key in (KEY, KEY, bytes(32)):
        reissue = Reissue(key)
        reissue.plan(Rows(records=[record]))  # type: ignore[arg-type]
        made.append(reissue.record(record))
    assert made[0] == made[1]
    assert made[2].id != made[0].id and made[2].salt != made[0].salt


def test_a_key_is_made_only_on_request_for_its_owner_alone(tmp_path: Path) -> None:
    path = tmp_path / "reissue.key"
    with pytest.raises(BundleError, match="--new-reissue-key"):  # never made unasked
        load_key(path)
    make_key(path)
    key = load_key(path)
    assert len(key) == 32 and load_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(BundleError, match="exists"):  # a second key is never made over one
        make_key(path)
    path.chmod(0o644)
    with pytest.raises(BundleError, match="chmod 600"):
        load_key(path)
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(BundleError):  # a link is not followed to make a key
        make_key(link)


@pytest.mark.parametrize("content", [b"", b"zz" * 32, b"ab" * 31, "é".encode() * 32,
                                     b"\xff" * 64])
def test_a_file_that_holds_no_key_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "reissue.key"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(BundleError, match="does not hold a reissue key"):
        load_key(path)


def test_what_names_a_record_the_bundle_does_not_hold_is_renamed_too() -> None:
    """A refused write's decision, an original retention removed (named by its summary and
    its decision), an erasure item of a record not here: any may be format 1, so none keeps
    the id or hash it had (found in review: decisions kept derived ids and plain SHA-256)."""
    gone = legacy("an original retention removed", 500)
    replaced = json.dumps([{"id": gone.id, "record_hash": gone.record_hash}],
                          separators=(",", ":"))
    summary = current(legacy("summary", 2_000), source=SUMMARY_SOURCE,
                      metadata={"replaces": replaced})
    plain = current(legacy("a note written since", 3_000))
    reissue = Reissue(KEY)
    reissue.plan(Rows(records=[record_to_proto(summary),  # type: ignore[arg-type]
                               record_to_proto(plain)]))
    new_summary = record_from_proto(reissue.record(record_to_proto(summary)))
    (named,) = json.loads(new_summary.metadata["replaces"])
    decided = reissue.decision(gpb.GateDecision(record_id=gone.id,
                                                content_hash=gone.content_hash))
    assert decided.record_id == named["id"] != gone.id
    assert decided.content_hash != gone.content_hash
    assert named["record_hash"] != gone.record_hash
    erasure = reissue.erasure(gpb.Erasure(items=[gpb.ErasedItem(
        kind="record", id=gone.id, leaf_hash=gone.record_hash)]))
    assert (erasure.items[0].id, erasure.items[0].leaf_hash) == (
        named["id"], named["record_hash"])
    # A format-2 record the bundle holds, unchanged, keeps its decision as it was.
    kept = gpb.GateDecision(record_id=plain.id, content_hash=plain.body_commitment)
    assert reissue.decision(kept) == kept
    assert reissue.record(record_to_proto(plain)) == record_to_proto(plain)


def test_a_reference_in_capitals_is_renamed_in_the_text() -> None:
    target = legacy("the target", 1_000)
    naming = current(legacy(f"see shard:{target.id.upper()} and shard:{target.id}", 2_000,
                            (f"record:{target.id}",)))
    reissue = Reissue(KEY)
    reissue.plan(Rows(records=[record_to_proto(target), record_to_proto(naming)]))  # type: ignore[arg-type]
    text = reissue.record(record_to_proto(naming)).content
    assert target.id not in text.lower()
    assert text.count(reissue.ids[target.id]) == 2


def test_the_id_map_is_its_owner_s_alone_whatever_was_left_before(tmp_path: Path) -> None:
    """A partial file left by an earlier attempt kept its mode (0644), and a link there was
    followed (found in review)."""
    from engram.cli.bundle import _write_id_map

    path = tmp_path / "ids.jsonl"
    partial = tmp_path / "ids.jsonl.partial"
    partial.write_text("left\n")
    partial.chmod(0o644)
    reissue = Reissue(KEY)
    reissue.plan(Rows(records=[record_to_proto(legacy("a lesson", 1_000))]))  # type: ignore[arg-type]
    _write_id_map(path, reissue)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not partial.exists()
    assert [json.loads(line)["new"] for line in path.read_text().splitlines()] == list(
        reissue.ids.values())
    elsewhere = tmp_path / "elsewhere"
    partial.symlink_to(elsewhere)
    _write_id_map(path, reissue)
    assert not elsewhere.exists()


def test_an_erasure_s_run_items_follow_the_chain_derived_again() -> None:
    """A run item's leaf is its run's head: a held run's becomes its new head; a run erased
    whole (not in the bundle) may have had a format-1 head, so its leaf is derived under the
    key; an empty run's leaf stays; a manifest erased (not here) gets a derived id and leaf."""
    created = Timestamp(seconds=1_700_000_000)
    link = chain.event_hash(prev_hash="", run_id="r", seq=1, type="t", payload_json="{}",
                            manifest_id="", artifact_ids=(), agent_id="a",
                            created_us=created.ToMicroseconds())
    event = apb.Event(run_id="r", seq=1, type="t", payload_json="{}", create_time=created,
                      hash=link, agent_id="a", format=1)
    listed = gpb.Erasure(items=[
        gpb.ErasedItem(kind="run", id="r", leaf_hash=link),
        gpb.ErasedItem(kind="run", id="gone", leaf_hash="ab" * 32),
        gpb.ErasedItem(kind="run", id="empty", leaf_hash=chain.EMPTY_RUN_LEAF),
        gpb.ErasedItem(kind="manifest", id="mf_" + "c" * 40, leaf_hash="cd" * 32)])
    reissue = Reissue(KEY)
    reissue.plan(Rows(events=[event], erasures=[listed]))  # type: ignore[arg-type]
    new_head = reissue.runs.event(event).hash  # a pass of its own, from the run's start
    assert new_head != link
    erasure = reissue.erasure(listed)
    held, gone, empty, manifest = erasure.items
    assert held.leaf_hash == new_head
    assert gone.leaf_hash not in ("ab" * 32, new_head) and len(gone.leaf_hash) == 64
    assert empty.leaf_hash == chain.EMPTY_RUN_LEAF
    assert manifest.id != "mf_" + "c" * 40 and manifest.id.startswith("mf_")
    assert manifest.leaf_hash != "cd" * 32


def test_a_manifest_and_a_snapshot_of_the_same_text_keep_their_own_leaves() -> None:
    """A format-1 manifest's content_hash and a format-1 snapshot's state_hash are both the
    SHA-256 of their JSON: one map held both, and the snapshot's commitment was listed for the
    manifest (found in review)."""
    text = '{"k":"v"}'
    created = Timestamp(seconds=1_700_000_000)
    manifest = apb.Manifest(manifest_id=chain.manifest_id(text), content_json=text,
                            content_hash=chain.sha256_text(text), create_time=created)
    snapshot = apb.Snapshot(snapshot_id="snap_" + "1" * 32, run_id="r", state_json=text,
                            state_hash=chain.sha256_text(text), create_time=created, format=1)
    listed = gpb.Erasure(items=[gpb.ErasedItem(kind="manifest", id=manifest.manifest_id,
                                               leaf_hash=manifest.content_hash)])
    reissue = Reissue(KEY)
    reissue.plan(Rows(manifests=[manifest], snapshots=[snapshot],  # type: ignore[arg-type]
                      erasures=[listed]))
    (item,) = reissue.erasure(listed).items
    new = reissue.runs.manifest(manifest)
    assert (item.id, item.leaf_hash) == (new.manifest_id, new.content_hash)


def test_planning_keeps_one_link_a_run_not_one_an_event() -> None:
    """The planning held each event's and line's link and hash (about 760 bytes an event:
    7.6 GB for ten million; found in review); now the erasures' leaves and a link a run."""
    created = Timestamp(seconds=1_700_000_000)
    events, prev = [], ""
    for seq in range(1, 201):
        link = chain.event_hash(prev_hash=prev, run_id="r", seq=seq, type="t",
                                payload_json="{}", manifest_id="", artifact_ids=(),
                                agent_id="a", created_us=created.ToMicroseconds())
        events.append(apb.Event(run_id="r", seq=seq, type="t", payload_json="{}",
                                create_time=created, prev_hash=prev, hash=link, agent_id="a",
                                format=1))
        prev = link
    reissue = Reissue(KEY)
    reissue.plan(Rows(events=events))  # type: ignore[arg-type]
    held = [*vars(reissue.runs).values(), *vars(reissue.runs.links).values()]
    assert all(len(value) <= 1 for value in held if isinstance(value, dict | set))
    relinked = [reissue.runs.event(e) for e in events]  # the import's pass
    assert all(b.prev_hash == a.hash for a, b in pairwise(relinked))


def test_an_erasure_s_iteration_log_item_follows_the_log_s_new_head() -> None:
    item = IterationInput(iteration=1, plan_digest="p", parent_digest="", start_ts="",
                          end_ts="", files_touched=0, net_add=0, net_del=0, risk_score=0.0,
                          status="ok", detail_json="{}", guardrails_json="[]")
    line = WarmLine.chained(item, 1, genesis_hash(FLEET, "log"))  # format 1
    row = {"run_id": "log", **MessageToDict(summary_pb(line), preserving_proto_field_name=True)}
    listed = gpb.Erasure(items=[
        gpb.ErasedItem(kind="iterations", id="log", leaf_hash=line.hash),
        gpb.ErasedItem(kind="iterations", id="gone", leaf_hash="ab" * 32)])
    reissue = Reissue(KEY)
    reissue.plan(Rows(iterations=[row], erasures=[listed]))  # type: ignore[arg-type]
    new_head = reissue.lines.iteration(*iteration_row(row)).summary.hash
    erasure = reissue.erasure(listed)
    assert erasure.items[0].leaf_hash == new_head != line.hash
    assert erasure.items[1].leaf_hash not in ("ab" * 32, new_head)
