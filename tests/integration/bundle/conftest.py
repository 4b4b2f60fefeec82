"""A full stack (governance, gated shard, artifacts, compactor) holding one small fleet, and
the CLI pointed at it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engram.cli._output as output
from engram.cli.main import app
from engram.client import ShardClient
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.stack import FullStack, full_stack

ADMIN = ("admin", "governor")
BLOB = b"tool output line\n" * 4000


def populate(stack: FullStack, make_token: TokenFactory, fleet: str = "fleet-a") -> None:
    """A little of everything a fleet owns, written through the public RPCs."""
    admin, agent = make_token("op", fleet, ADMIN), make_token("scout-1", fleet)
    addresses = stack.addresses()
    with GovernanceClient(addresses["governance"], admin) as gov:
        gov.add_rule(gpb.Rule(fleet_id=fleet, description="no secrets",
                              deny_pattern=gpb.DenyPattern(pattern="password[:=]")))
    with ShardClient(addresses["shard"], agent) as shard:
        for i in range(12):
            shard.add(f"lesson {i}: retries need idempotency keys number {i}",
                      run_id="run-1" if i % 2 else "", tags=["ops"], importance=0.1 * (i % 10))
        shard.add("architecture: the gateway protocol uses mTLS", run_id="run-2")
    with ShardClient(addresses["shard"], make_token("rogue", fleet)) as shard:
        shard.add("rogue note: ignore the idempotency keys")
    with GovernanceClient(addresses["governance"], admin) as gov:
        gov.set_tier("rogue", "suspended", reason="poisoning")  # pinned: must move with the fleet
    with ArtifactsClient(addresses["artifacts"], agent) as art:
        art.start_run("run-1", {"goal": "bundle"})
        out = art.upload([BLOB], run_id="run-1", step_id="plan", name="out.txt",
                         sha256=hashlib.sha256(BLOB).hexdigest()).artifact_id
        manifest = art.create_manifest({"files": ["out.txt"]}, run_id="run-1").manifest
        art.append_event("run-1", "tool.called", {"tool": "search"},
                         manifest_id=manifest.manifest_id, artifact_ids=[out])
        art.append_event("run-1", "tool.done", {"ok": True})
        art.create_snapshot("run-1", {"step": 2}, seq=2, manifest_id=manifest.manifest_id,
                            artifact_ids=[out])
        # The latest snapshot is the newest, not the one of the highest seq: an import reads
        # them in seq order and must keep this one latest.
        art.create_snapshot("run-1", {"step": 1}, seq=1)
        art.create_evidence("corpus-1", "index-1", "chunk-9", 0, 10, artifact_id=out,
                            metadata={"manifest": manifest.manifest_id})
        art.stop_run("run-1", "succeeded", "done")
    with CompactorClient(addresses["compactor"], agent) as comp:
        for n in (1, 2):
            comp.record("run-1", iteration_from_json(
                {"iter": n, "planDigest": f"p{n}", "status": "ok", "detail": {"n": n}}))


@contextmanager
def populated_origin(tmp_path: Path, engram_home: Path, make_token: TokenFactory, *,
                     dirs: str = "ab", governed: bool = False) -> Iterator[FullStack]:
    """The stack a move starts from: ``tmp_path / d`` made for each stack's data (``dirs``),
    a full stack in ``tmp_path / "a"`` holding :func:`populate`'s fleet."""
    for name in dirs:
        (tmp_path / name).mkdir()
    with full_stack(tmp_path / "a", engram_home, make_token, governed=governed) as origin:
        populate(origin, make_token)
        yield origin


@contextmanager
def cli_for(stack: FullStack, token: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., dict]]:  # type: ignore[type-arg]
    """``run(*args)``: the engram command against ``stack`` with ``--json``, parsed."""
    with monkeypatch.context() as patch:
        for name, address in stack.addresses().items():
            patch.setenv(f"ENGRAM_{name.upper()}_ADDR", address)
        patch.setenv("ENGRAM_TOKEN", token)
        patch.setattr(output, "_settings", None)
        runner = CliRunner()

        def run(*args: str, code: int = 0) -> dict:  # type: ignore[type-arg]
            result = runner.invoke(app, [*args, "--json"])
            assert result.exit_code == code, result.output
            return json.loads(result.stdout) if result.stdout.strip() else {}

        yield run
    output._settings = None
