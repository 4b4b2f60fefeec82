"""The shard's write path with a gate, over real gRPC (governance itself is covered in
tests/integration/governance; here a recording gate checks what the shard asks and stores)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError, ShardClient, record_input
from engram.shard.v1 import shard_service_pb2 as spb
from services.shard.ports import GateCandidate, GateDecision, Neighbour
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


class RecordingGate:
    """Allows everything except content containing "forbidden"; remembers every question."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str], str]] = []

    def decide(self, fleet_id: str, agent_id: str, candidates: Sequence[GateCandidate],
               request_id: str,
               find_neighbours: Callable[[GateCandidate], Sequence[Neighbour]]
               ) -> list[GateDecision]:
        self.calls.append((fleet_id, agent_id, [c.record_id for c in candidates], request_id))
        return [
            GateDecision(False, f"d{len(self.calls)}-{i}", ("rule:forbidden",), "forbidden word")
            if "forbidden" in c.content else GateDecision(True, f"d{len(self.calls)}-{i}")
            for i, c in enumerate(candidates)
        ]


@pytest.fixture
def gated(tmp_path: Path, engram_home: Path,
          make_token: TokenFactory) -> Iterator[tuple[ShardClient, RecordingGate]]:
    gate = RecordingGate()
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'g.db'}", port=0,
                             embedder="none")
    server, _service = build_shard_server(settings, gate=gate)
    server.start()
    client = ShardClient(server.address, make_token("agent-g", "fleet-g"))
    try:
        yield client, gate
    finally:
        client.close()
        server.stop(0)


def test_building_without_a_gate_is_refused(tmp_path: Path, engram_home: Path) -> None:
    with pytest.raises(ValueError, match="governance gate"):
        build_shard_server(ShardSettings(home=engram_home, port=0,
                                         db_url=f"sqlite:///{tmp_path / 'x.db'}"))


def test_every_stored_record_carries_its_decision(gated: tuple[ShardClient, RecordingGate]) -> None:
    client, gate = gated
    stored = client.add("task: ship the gate").record
    assert stored.id in gate.calls[0][2] and gate.calls[0][:2] == ("fleet-g", "agent-g")
    assert client.verify([stored.id]).failures == []  # the decision id is under the record hash
    with pytest.raises(EngramRpcError) as caught:
        client.add("a forbidden thought")
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.metadata["rule_ids"] == "rule:forbidden"
    assert client.status().total_records == 1


def test_gate_key_is_the_client_request_id_never_the_content(
        gated: tuple[ShardClient, RecordingGate]) -> None:
    client, gate = gated
    client.add("task: one", request_id="req-a")
    client.add("task: two")  # the SDK draws a request_id for a write given none
    client.call(client.stub.CreateRecord, spb.CreateRecordRequest(
        record=spb.RecordInput(content="task: three")))  # a raw call without one
    # The client's request_id, bound to the request's body (a digest of every field).
    assert gate.calls[0][3].startswith("req-a:")
    drawn, _, digest = gate.calls[1][3].partition(":")
    assert len(drawn) == 32 and digest and "two" not in gate.calls[1][3]
    assert gate.calls[2][3] == ""  # the governance adapter mints a fresh id for it


def test_existing_records_skip_the_gate_and_replays_keep_every_result(
        gated: tuple[ShardClient, RecordingGate]) -> None:
    client, gate = gated
    old = client.add("task: already here").record
    calls = len(gate.calls)
    batch = [record_input("task: already here"), record_input("task: brand new")]
    first = client.add_many(batch, request_id="req-mixed")
    assert [r.created for r in first.results] == [False, True]
    assert gate.calls[calls][2] == [first.results[1].record.id]  # only the new one is asked
    replay = client.add_many(batch, request_id="req-mixed")
    assert [r.record.id for r in replay.results] == [old.id, first.results[1].record.id]
    assert len(gate.calls) == calls + 1  # a replay asks nothing
