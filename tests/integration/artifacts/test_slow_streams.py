"""Slow ReplayEvents and ReadArtifact readers hold no database session while they stall:
more of them than the connection pool holds all finish, and writes go through meanwhile."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from engram.client.artifacts import ArtifactsClient
from tests.integration.artifacts.conftest import RunningArtifacts

READERS = 20
"""More than either pool holds (SQLite: 8 + 10 overflow; Postgres: 8 + 8)."""
EVENTS = 150
"""At 1 KB each, past the 64 KB a stalled reader's HTTP/2 window lets run ahead."""


@pytest.fixture
def stalling_client(artifacts_server: RunningArtifacts,
                    make_token: Callable[..., str]) -> Iterator[Callable[[], ArtifactsClient]]:
    opened: list[grpc.Channel] = []

    def connect() -> ArtifactsClient:
        # No BDP probing: the window stays at HTTP/2's initial 64 KB, so the server stalls.
        channel = grpc.insecure_channel(artifacts_server.server.address,
                                        options=[("grpc.http2.bdp_probe", 0)])
        opened.append(channel)
        return ArtifactsClient(artifacts_server.server.address, make_token(), channel=channel,
                               timeout=120)

    yield connect
    for channel in opened:
        channel.close()


def test_slow_replay_and_read_streams_hold_no_session(
        artifacts_server: RunningArtifacts, stalling_client: Callable[[], ArtifactsClient],
        tmp_path: Path) -> None:
    env = artifacts_server
    writer = env.client
    run_id = writer.start_run("run-1").run.run_id
    for seq in range(EVENTS):
        writer.append_event(run_id, "tick", {"seq": seq, "pad": "p" * 1000})
    data = os.urandom(1024 * 1024)
    artifact = writer.upload(iter([data]), run_id=run_id, step_id="s", name="blob")

    started = time.monotonic()
    replays, reads = [], []
    for index in range(READERS):
        reader = stalling_client()
        if index % 2:
            replay = reader.replay(run_id)
            next(replay)
            replays.append(replay)
        else:
            _meta, chunks = reader.read(artifact.artifact_id, chunk_size=16 * 1024)
            next(chunks)
            reads.append(chunks)
    event = writer.append_event(run_id, "while-stalled", {}).event
    assert writer.create_snapshot(run_id, {"at": event.seq}).seq == EVENTS + 1
    assert time.monotonic() - started < 15

    counts: dict[str, list[int]] = {"replay": [], "read": []}
    lock = threading.Lock()

    def drain(kind: str, stream: Iterator[object]) -> None:
        total = 1 + sum(1 for _ in stream)
        with lock:
            counts[kind].append(total)

    threads = [threading.Thread(target=drain, args=("replay", s)) for s in replays]
    threads += [threading.Thread(target=drain, args=("read", s)) for s in reads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # A replay is the log as it was when the replay started.
    assert counts["replay"] == [EVENTS] * (READERS // 2)
    assert counts["read"] == [len(data) // (16 * 1024)] * (READERS // 2)
