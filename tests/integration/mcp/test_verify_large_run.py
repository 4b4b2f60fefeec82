"""MCP verify_run on a tampered run of more than ENGRAM_LIMITS_BATCH_ITEMS (1000) records
(found by review, 2026-11-28)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from sqlalchemy import text

from engram.client import ShardClient
from engram.mcp_server import build_mcp_server
from engram.mcp_server._backends import FixedToken
from engram.shard.v1 import shard_service_pb2 as pb
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings


@pytest.fixture
def shard(tmp_path: Path, engram_home: Path) -> Iterator[tuple[str, Any]]:
    settings = ShardSettings(home=engram_home, db_url=f"sqlite:///{tmp_path / 'shard.db'}",
                             port=0, allow_ungated=True)
    server, service = build_shard_server(settings)
    server.start()
    try:
        yield server.address, service
    finally:
        server.stop(0)


def test_verify_run_reports_the_tampered_record_of_a_large_run(shard, make_token) -> None:  # type: ignore[no-untyped-def]
    """Expected: {"ok": false, "failures": [<the tampered record>]} as for a small run
    (the tool's doc: 'ok is false and failures names each memory whose hashes do not
    match'). Before, verify_run sent every id of the run in ONE VerifyRecords call; past
    1000 ids the shard answered INVALID_ARGUMENT LIMIT_EXCEEDED, so the tool reported a
    limit error and the tampering was not reported at all."""
    address, service = shard
    token = make_token()
    client = ShardClient(address, token)
    ids: list[str] = []
    for start in range(0, 1005, 200):
        written = client.add_many([pb.RecordInput(content=f"task: note number {i}",
                                                  run_id="big-run")
                                   for i in range(start, min(start + 200, 1005))])
        ids += [w.record.id for w in written.results]
    bad = ids[-1]
    with service.db.engine.begin() as conn:
        conn.execute(text("UPDATE records SET content = 'task: edited' WHERE id = :id"),
                     {"id": bad})

    class Backends:
        def shard(self, token: str) -> ShardClient:
            return ShardClient(address, token)

        def artifacts(self, token: str) -> Any:
            raise AssertionError

    server = build_mcp_server(Backends(), FixedToken(token))  # type: ignore[arg-type]

    async def main() -> Any:
        async with Client(server) as mcp_client:
            return await mcp_client.call_tool("verify_run", {"run": "big-run"})

    result = anyio.run(main)
    body = " ".join(getattr(block, "text", "") for block in result.content)
    assert not result.is_error, body[:500]
    assert result.structured_content["ok"] is False
    assert [f["id"] for f in result.structured_content["failures"]] == [bad]
    assert result.structured_content["checked"] == 1005
