"""Slow SnapshotForRun readers hold no database session between pages: more of them than
the connection pool holds all finish, and a write made meanwhile goes through at once."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from engram.client import ShardClient
from engram.shard.v1 import shard_service_pb2 as pb
from services.shard.service import SNAPSHOT_PAGE, ShardService
from tests.conftest import TokenFactory
from tests.integration.shard.conftest import ClientFactory

READERS = 20
"""More than either pool holds (SQLite: 8 + 10 overflow; Postgres: 8 + 8)."""
RECORDS = SNAPSHOT_PAGE + 20
"""Two pages, each past what HTTP/2 flow control lets run ahead of a reader that stops."""
_WORDS = [f"w{i}" for i in range(400)]


@pytest.fixture
def channels() -> Iterator[list[grpc.Channel]]:
    opened: list[grpc.Channel] = []
    yield opened
    for channel in opened:
        channel.close()


def _content(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(6000))[:30_000]


def test_slow_snapshot_readers_do_not_starve_writes(
        shard: tuple[str, ShardService], client_for: ClientFactory, make_token: TokenFactory,
        channels: list[grpc.Channel]) -> None:
    address, writer = shard[0], client_for()
    rng = random.Random(7)
    for start in range(0, RECORDS, 40):
        writer.add_many([pb.RecordInput(content=_content(rng), run_id="run-s")
                         for _ in range(min(40, RECORDS - start))])
    streams: list[Iterator[pb.Record]] = []
    started = time.monotonic()
    for _ in range(READERS):
        # A reader's window stays at HTTP/2's initial 64 KB (no BDP growth): it stalls the server.
        channel = grpc.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0)])
        channels.append(channel)
        reader = ShardClient(address, make_token(), channel=channel, timeout=120)
        stream = reader.snapshot("run-s")
        next(stream)  # started, then the reader stalls
        streams.append(stream)
    # Before, the first 18 stalled readers held every connection of the pool: the 19th
    # waited out the pool's 30 s timeout, and so did every write and read behind it.
    written = writer.call(writer.stub.CreateRecord, pb.CreateRecordRequest(
        record=pb.RecordInput(content="a write while every reader stalls", run_id="run-w")),
        timeout=15)
    assert writer.get(written.record.id).content == "a write while every reader stalls"
    assert time.monotonic() - started < 15

    counts = [0] * READERS

    def drain(index: int) -> None:
        counts[index] = 1 + sum(1 for _ in streams[index])

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(READERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert counts == [RECORDS] * READERS
