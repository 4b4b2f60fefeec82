"""Event items of runs with the longest ids, and seqs no store holds (found by review).

An event item id is ``<run_id>:<seq>``: with a run id of 127 or 128 characters (valid
everywhere: an agent picks it) the item is longer than an identifier, and governance refused
the WHOLE erasure, so ``engram forget --match`` / ``--agent`` erased nothing of what they
found, records included. A seq beyond 64 bits was accepted by governance and failed ForgetRuns
INTERNAL inside the database driver; it is refused INVALID_ITEM when recorded."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.governance import GovernanceClient
from engram.client.shard import ShardClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.stack import full_stack

FLEET = "fleet-long"
LONG = "r" * 128


def test_events_of_a_run_with_a_128_character_id_are_erased(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = make_token("op", FLEET, ADMIN)
    owner, visitor = make_token("scout-1", FLEET), make_token("scout-2", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, owner) as art:
            art.start_run(LONG, {})
            art.append_event(LONG, "said", {"text": "zqxlong subject"})
        with ArtifactsClient(stack.artifacts.address, visitor) as art:
            art.append_event(LONG, "said", {"text": "a visit"})
        with ShardClient(stack.shard.address, owner) as shard:
            record = shard.add("zqxlong subject, remembered", run_id=LONG).record
        with cli_for(stack, admin, monkeypatch) as run:
            done = run("forget", "--match", "zqxlong")  # was refused whole: INVALID_ARGUMENT
            assert (done["events_erased"], done["erased"]) == (1, 1)
            done = run("forget", "--agent", "scout-2")
            assert done["events_erased"] == 1
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            assert [bool(e.erasure_id) for e in art.replay(LONG)] == [True, True]
        with ShardClient(stack.shard.address, admin) as shard, pytest.raises(EngramRpcError):
            shard.get(record.id)


def test_a_seq_beyond_64_bits_is_refused_when_recorded(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin = make_token("op", FLEET, ADMIN)
    with (full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack,
          GovernanceClient(stack.governance.address, admin) as gov):
        for seq in (str(2**63), "9" * 25):
            with pytest.raises(EngramRpcError) as refused:
                gov.record_erasure("match", "", [gpb.ErasedItem(
                    kind="event", id=f"run-s:{seq}", leaf_hash="a" * 64)])
            assert (refused.value.code, refused.value.reason) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ITEM")
        gov.record_erasure("match", "", [gpb.ErasedItem(
            kind="event", id=f"{LONG}:{2**63 - 1}", leaf_hash="a" * 64)])
