"""A purge that failed is not skipped when the erasure is run again (found by review).

After an erasure commits, its purge empties SQLite's WAL (the erased rows' old pages are there).
When a reader holds the WAL, the purge fails UNAVAILABLE WAL_BUSY, "run the erasure again to
finish it". The throttle that keeps reruns from purging the whole store on every call had
already counted that failed purge: the rerun erased nothing new, skipped the purge and answered
OK with the erased payload still in ``artifacts.db-wal`` (the client's own retry of UNAVAILABLE
made that happen inside one call). A purge now counts only once it succeeded.

Real servers; the first call's channel does not retry, so the reader can be let go between the
failed call and its rerun."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client._channel import open_channel
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.client.shard import ShardClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN
from tests.stack import FullStack, full_stack

FLEET = "fleet-w"


@pytest.mark.slow  # the failed purge waits out SQLite's busy timeout (10 s)
def test_a_rerun_after_wal_busy_purges(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    marker = "zqxwal" + secrets.token_hex(6)
    data = tmp_path / "data"
    wal = data / "artifacts.db-wal"
    with full_stack(data, engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-w", {})
            planted = art.append_event("run-w", "said", {"m": marker}).event
        with GovernanceClient(stack.governance.address, admin) as gov:
            erasure = gov.record_erasure("match", "", [gpb.ErasedItem(
                kind="event", id="run-w:1", leaf_hash=planted.hash)]).erasure
        channel = open_channel(stack.artifacts.address, retries=False)
        with ArtifactsClient(stack.artifacts.address, admin, channel=channel) as art:
            reader = sqlite3.connect(data / "artifacts.db")
            try:
                reader.execute("BEGIN")
                reader.execute("SELECT count(*) FROM events").fetchone()  # holds a snapshot
                with pytest.raises(EngramRpcError) as busy:
                    art.forget_runs(erasure.erasure_id)
                assert (busy.value.code, busy.value.reason) == (
                    grpc.StatusCode.UNAVAILABLE, "WAL_BUSY")
            finally:
                reader.rollback()
                reader.close()
            assert marker.encode() in wal.read_bytes()  # committed, not purged yet
            done = art.forget_runs(erasure.erasure_id)  # the rerun the error asks for
            assert (done.events_erased, done.items_already_erased) == (0, 1)
            # It answered OK: the purge it owed ran.
            assert not (wal.exists() and marker.encode() in wal.read_bytes())
        with ArtifactsClient(stack.artifacts.address, admin) as art:
            assert [bool(e.erasure_id) for e in art.replay("run-w")] == [True]


@contextmanager
def _held(db: Path) -> Iterator[None]:
    """A reader holding a snapshot of ``db``: a WAL checkpoint cannot finish meanwhile."""
    reader = sqlite3.connect(db)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sqlite_master").fetchone()
        yield
    finally:
        reader.rollback()
        reader.close()


def _busy_then_rerun(stack: FullStack, data: Path, service: str, marker: str,
                     erase: Callable[[grpc.Channel], object]) -> None:
    """The erasure's first call meets a held WAL (UNAVAILABLE WAL_BUSY); its rerun purges."""
    wal = data / f"{service}.db-wal"
    address = getattr(stack, service).address
    with _held(data / f"{service}.db"), pytest.raises(EngramRpcError) as busy:
        erase(open_channel(address, retries=False))
    assert (busy.value.code, busy.value.reason) == (grpc.StatusCode.UNAVAILABLE, "WAL_BUSY")
    assert marker.encode() in wal.read_bytes()  # committed, not purged yet
    erase(open_channel(address, retries=False))  # the rerun the error asks for: OK
    assert not (wal.exists() and marker.encode() in wal.read_bytes())


@pytest.mark.slow
def test_the_shard_and_the_compactor_purge_on_a_rerun_after_wal_busy(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    marker = "zqxwal" + secrets.token_hex(6)
    data = tmp_path / "data"
    with full_stack(data, engram_home, make_token, governed=True) as stack:
        with ShardClient(stack.shard.address, agent) as shard:
            record = shard.add(f"remember {marker}").record
        with CompactorClient(stack.compactor.address, agent) as comp:
            comp.record("run-c", iteration_from_json(
                {"iter": 1, "planDigest": "p1", "status": "ok", "detail": {"m": marker}}))
        with CompactorClient(stack.compactor.address, admin) as comp:
            [log] = comp.find_iteration_logs(marker).runs
        with GovernanceClient(stack.governance.address, admin) as gov:
            erasure_id = gov.record_erasure("match", "", [
                gpb.ErasedItem(kind="record", id=record.id, leaf_hash=record.record_hash),
                gpb.ErasedItem(kind="iterations", id="run-c", leaf_hash=log.head_hash),
            ]).erasure.erasure_id

        def forget_records(channel: grpc.Channel) -> object:
            with ShardClient(stack.shard.address, admin, channel=channel) as shard:
                return shard.forget(erasure_id=erasure_id)

        def forget_iterations(channel: grpc.Channel) -> object:
            with CompactorClient(stack.compactor.address, admin, channel=channel) as comp:
                return comp.forget_iterations(erasure_id)

        _busy_then_rerun(stack, data, "shard", marker, forget_records)
        _busy_then_rerun(stack, data, "compactor", marker, forget_iterations)
