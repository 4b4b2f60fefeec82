"""Format-2 events and snapshots (docs/erasure.md): the chain and the state hash cover a salted
commitment, not the content, so a hash left after an erasure confirms no guess; a flipped
payload, state, salt or commitment is still found; format-1 items verify as before."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from services.artifacts.domain.chain import (
    ChainVerifier,
    event_hash,
    event_intact,
    expected_hash,
    expected_state_hash,
    new_snapshot_state,
    next_event,
    payload_commitment,
)
from services.artifacts.domain.entities import Event, EventDraft, Run, RunStatus, Snapshot
from services.common.canonical import canonical_bytes
from services.common.commitment import COMMIT_LABEL, commitment, commits_to, new_salt
from services.common.errors import IntegrityError
from services.shard.domain.records import body_commitment


def _run(events: list[Event]) -> Run:
    head = events[-1].hash if events else ""
    return Run(run_id="r", fleet_id="f", agent_id="a", status=RunStatus.RUNNING,
               stop_reason="", created_us=1, stopped_us=0, event_count=len(events),
               head_hash=head, latest_snapshot_id="", metadata_json="{}")


def _chain(payloads: list[str]) -> list[Event]:
    events: list[Event] = []
    for n, payload in enumerate(payloads, start=1):
        events.append(next_event(_run(events), EventDraft("tool.called", payload,
                                                          agent_id="a"), created_us=n))
    return events


def _format_1(payload: str, event: Event) -> str:
    """The hash a format-1 chain would give this event: what a guess of its payload, without
    the salt, can recompute."""
    return event_hash(prev_hash=event.prev_hash, run_id=event.run_id, seq=event.seq,
                      type=event.type, payload_json=payload, manifest_id=event.manifest_id,
                      artifact_ids=event.artifact_ids, agent_id=event.agent_id,
                      created_us=event.created_us)


def test_the_commitment_is_the_records_construction() -> None:
    """One construction for every kind: a record's body_commitment is the same function over
    its canonical body."""
    salt = new_salt()
    body = {"content": "x", "tags": ["a"], "metadata": {"k": "v"}}
    assert commitment(salt, canonical_bytes(body)) == body_commitment(salt, "x", ("a",),
                                                                      {"k": "v"})
    assert commitment(salt, b"y") == hashlib.sha256(
        COMMIT_LABEL + bytes.fromhex(salt) + b"y").hexdigest()
    assert not commits_to("not hex", b"y", commitment(salt, b"y"))
    assert not commits_to(salt.upper(), b"y", commitment(salt, b"y"))
    with pytest.raises(ValueError):
        commitment(salt[:-2], b"y")


def test_a_new_event_chains_its_payloads_commitment_not_its_payload() -> None:
    events = _chain(['{"q":"secret"}', '{"q":"other"}'])
    assert ChainVerifier("r").check_all(events) == events[-1].hash
    first = events[0]
    assert first.format == 2 and len(first.salt) == 64
    assert first.payload_commitment == payload_commitment(first.salt, first.payload_json)
    assert events[1].salt != first.salt  # a salt per event
    # the hash covers the commitment, not the payload: with the payload gone (an erasure
    # deletes it and the salt) the link still recomputes from what is kept...
    assert expected_hash(replace(first, payload_json="", salt=""), "") == first.hash
    assert event_intact(first, "")
    # ...while the commitment binds the payload: another one under it does not verify
    assert not event_intact(replace(first, payload_json='{"q":"guess"}'), "")
    # ...and a guess of the payload, hashed as format 1 did, confirms nothing
    assert _format_1(first.payload_json, first) != first.hash
    assert hashlib.sha256(first.payload_json.encode()).hexdigest() not in {
        first.hash, first.payload_commitment}


@pytest.mark.parametrize("field", ["payload_json", "salt", "payload_commitment", "hash",
                                   "type", "format"])
def test_a_flip_in_any_field_of_a_format_2_event_breaks_the_chain(field: str) -> None:
    events = _chain(['{"i":1}', '{"i":2}', '{"i":3}'])
    value = getattr(events[1], field)
    if field == "format":
        flipped: object = 1
    else:
        at = len(value) // 2
        flipped = value[:at] + ("0" if value[at] != "0" else "1") + value[at + 1:]
    altered = [events[0], replace(events[1], **{field: flipped}), events[2]]
    with pytest.raises(IntegrityError) as broken:
        ChainVerifier("r").check_all(altered)
    assert broken.value.reason == "EVENT_CHAIN_BROKEN"


def test_a_salt_that_no_longer_parses_is_a_broken_link_not_a_crash() -> None:
    (event,) = _chain(['{"i":1}'])
    for salt in ("zz" + event.salt[2:], event.salt[:-1], ""):
        with pytest.raises(IntegrityError):
            ChainVerifier("r").check(replace(event, salt=salt))


def test_format_1_events_still_verify_and_a_chain_may_mix_formats() -> None:
    head, old = "", []
    for seq in (1, 2):
        payload = f'{{"i":{seq}}}'
        digest = event_hash(prev_hash=head, run_id="r", seq=seq, type="t",
                            payload_json=payload, manifest_id="", artifact_ids=(),
                            agent_id="a", created_us=seq)
        old.append(Event("r", seq, "t", payload, "", (), seq, "a", head, digest))
        head = digest
    new = next_event(_run(old), EventDraft("t", '{"i":3}', agent_id="a"), created_us=3)
    assert ChainVerifier("r").check_all([*old, new]) == new.hash
    with pytest.raises(IntegrityError):  # an old event edited
        ChainVerifier("r").check_all([replace(old[0], payload_json='{"i":9}'), old[1], new])
    for stray in ({"salt": new_salt()}, {"payload_commitment": "0" * 64}, {"format": 3}):
        # a format-1 event carries no salt or commitment; a format is 1 or 2
        with pytest.raises(IntegrityError):
            ChainVerifier("r").check_all([replace(old[0], **stray), old[1]])


def test_a_snapshots_state_hash_is_its_states_commitment() -> None:
    state = '{"seen":"secret"}'
    snapshot = new_snapshot_state(Snapshot("snap_1", "r", 1, state, "", "", (), 1))
    assert snapshot.format == 2 and len(snapshot.salt) == 64
    assert snapshot.state_hash == commitment(snapshot.salt, state.encode())
    assert snapshot.state_hash != hashlib.sha256(state.encode()).hexdigest()
    assert expected_state_hash(2, snapshot.salt, state) == snapshot.state_hash
    assert expected_state_hash(2, snapshot.salt, '{"seen":"secreT"}') != snapshot.state_hash
    assert expected_state_hash(2, new_salt(), state) != snapshot.state_hash
    assert expected_state_hash(2, "zz" + snapshot.salt[2:], state) == ""
    assert expected_state_hash(1, "", state) == hashlib.sha256(state.encode()).hexdigest()
    assert expected_state_hash(1, snapshot.salt, state) == ""  # format 1 has no salt
    assert expected_state_hash(3, snapshot.salt, state) == ""
