"""Domain rules: validation, hash chain, deterministic ids, stop semantics."""

from __future__ import annotations

import pytest

from services.artifacts.domain import validation as check
from services.artifacts.domain.chain import (
    ChainVerifier,
    event_hash,
    evidence_id,
    manifest_id,
)
from services.artifacts.domain.entities import Event, Pointer, PointerType, Resolution
from services.artifacts.domain.stop import PointerResolver, unresolved_payload
from services.common.errors import IntegrityError, InvalidArgument


def _chain(n: int, run_id: str = "r") -> list[Event]:
    events, head = [], ""
    for seq in range(1, n + 1):
        payload = f'{{"i":{seq}}}'
        digest = event_hash(prev_hash=head, run_id=run_id, seq=seq, type="t",
                            payload_json=payload, manifest_id="", artifact_ids=(),
                            agent_id="a", created_us=seq)
        events.append(Event(run_id, seq, "t", payload, "", (), seq, "a", head, digest))
        head = digest
    return events


def test_chain_verifies_and_catches_edit_gap_and_reorder() -> None:
    events = _chain(5)
    assert ChainVerifier("r").check_all(events) == events[-1].hash
    edited = list(events)
    edited[2] = Event(**{**events[2].__dict__, "payload_json": '{"i":99}'})
    with pytest.raises(IntegrityError):
        ChainVerifier("r").check_all(edited)
    with pytest.raises(IntegrityError):
        ChainVerifier("r").check_all(events[:2] + events[3:])
    with pytest.raises(IntegrityError):
        ChainVerifier("r").check_all([events[1], events[0], *events[2:]])


def test_evidence_id_is_deterministic_and_namespaced() -> None:
    base = evidence_id("corpus", "idx", "c1", 0, 10)
    assert base == evidence_id("corpus", "idx", "c1", 0, 10)
    assert base.startswith("ev_")
    others = {evidence_id("corpus2", "idx", "c1", 0, 10),
              evidence_id("corpus", "idx2", "c1", 0, 10),
              evidence_id("corpus", "idx", "c2", 0, 10),
              evidence_id("corpus", "idx", "c1", 0, 11)}
    assert base not in others and len(others) == 4


def test_manifest_id_follows_canonical_content() -> None:
    one = check.json_document("m", '{"b": 1, "a": [1, 2]}')
    two = check.json_document("m", '{"a":[1,2],"b":1}')
    assert one == two and manifest_id(one) == manifest_id(two)


@pytest.mark.parametrize("name", ["../x", "a/../b", "/abs", "", "a//b", "./a", "a\\b"])
def test_artifact_names_refuse_traversal(name: str) -> None:
    with pytest.raises(InvalidArgument):
        check.artifact_path("fleet", "run", "step", "art_1", name)


def test_artifact_path_is_fleet_and_run_scoped() -> None:
    assert (check.artifact_path("f-1", "r-1", "s.2", "art_1", "out/x.pdf")
            == "fleets/f-1/runs/r-1/s.2/art_1/out/x.pdf")
    for fleet, run in (("f", "r/1"), ("f", ".."), ("..", "r"), ("f/g", "r"), ("f", "r\x00")):
        with pytest.raises(InvalidArgument):
            check.artifact_path(fleet, run, "s", "art_1", "x")


def test_documents_are_bounded_to_fit_a_row() -> None:
    with pytest.raises(InvalidArgument) as caught:
        check.json_document("payload", '"' + "x" * (check.MAX_DOCUMENT_BYTES + 1) + '"')
    assert caught.value.reason == "DOCUMENT_TOO_LARGE"
    with pytest.raises(InvalidArgument):
        check.metadata_object('{"k": "' + "y" * check.MAX_METADATA_BYTES + '"}')
    with pytest.raises(InvalidArgument):
        check.metadata_object("[1, 2]")
    with pytest.raises(InvalidArgument):
        check.json_document("payload", "{not json")
    assert check.metadata_object("") == "{}"


@pytest.mark.parametrize("text", ["NaN", '{"x": Infinity}', "[-Infinity]", '{"big": 1e999}'])
def test_nan_and_infinities_are_refused_as_invalid_json(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check.json_document("payload_json", text)
    assert caught.value.reason == "INVALID_JSON"
    assert caught.value.message.startswith("payload_json is not valid JSON: NaN")


@pytest.mark.parametrize("text", ['"\\ud800"', '{"note": "\\udfff"}', '{"\\udc00": 1}'])
def test_a_lone_surrogate_escape_is_refused_as_invalid_json(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check.json_document("payload_json", text)
    assert caught.value.reason == "INVALID_JSON"
    assert "lone surrogate" in caught.value.message


class _Lookups:
    def __init__(self, answers: list[Resolution]) -> None:
        self.answers = answers
        self.calls = 0

    def __call__(self, _pointer: Pointer) -> Resolution:
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


def test_critical_pointer_is_retried_exactly_once() -> None:
    pointer = Pointer(PointerType.ARTIFACT, "art_1")
    transient = _Lookups([Resolution(False, "p", "h"), Resolution(True, "p", "h")])
    sleeps: list[float] = []
    outcome = PointerResolver(transient, 0.25, sleeps.append).resolve(pointer, critical=True)
    assert (outcome.resolution.resolved, outcome.attempts, transient.calls) == (True, 2, 2)
    assert sleeps == [0.25]
    gone = _Lookups([Resolution(False, "p", "h")])
    outcome = PointerResolver(gone, 0, lambda _s: None).resolve(pointer, critical=True)
    assert (outcome.resolution.resolved, outcome.attempts, gone.calls) == (False, 2, 2)


def test_non_critical_pointer_gets_one_attempt() -> None:
    gone = _Lookups([Resolution(False)])
    outcome = PointerResolver(gone, 0, lambda _s: None).resolve(
        Pointer(PointerType.MANIFEST, "m"), critical=False)
    assert (outcome.resolution.resolved, outcome.attempts, gone.calls) == (False, 1, 1)


def test_stop_payload_names_pointer_type_id_path_and_hash() -> None:
    payload = unresolved_payload(Pointer(PointerType.EVIDENCE, "ev_1"),
                                 Resolution(False, "runs/r/s/x", "abc"), 2)
    assert '"pointer":{"hash":"abc","id":"ev_1","path":"runs/r/s/x","type":"evidence"}' in payload
    assert '"status":"SYSTEM_ERROR"' in payload
