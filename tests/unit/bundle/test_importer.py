"""The importer on hostile or large bundles, against fake clients of an empty fleet-a."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engram.bundle.format import (
    MANIFEST_PATH,
    BundleError,
    BundleReader,
    Manifest,
    Member,
    canonical_line,
    part_path,
)
from engram.bundle.importer import Importer


def bundle_with_part(out: Path, kind: str, lines: list[bytes]) -> None:
    data = b"".join(lines)
    member = Member(part_path(kind), len(data), hashlib.sha256(data).hexdigest(), len(lines))
    manifest = Manifest(fleet_id="fleet-a", members=[member]).to_bytes()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, content in ((member.path, data), (MANIFEST_PATH, manifest)):
            info = tarfile.TarInfo(path)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


class FakeClients:
    """Clients of an empty target instance in fleet-a: every call answers 'nothing here'."""

    def __init__(self) -> None:
        reply = SimpleNamespace(created=1, already_present=0)
        self.trust_calls: list[list[str]] = []
        self.shard = SimpleNamespace(
            status=lambda: SimpleNamespace(fleet_id="fleet-a"), domains=lambda: [],
            upsert_domain=lambda *a, **k: reply, import_records=lambda b: reply,
            import_tombstones=lambda b: reply, forget=lambda **k: None)
        self.governance = SimpleNamespace(
            rules=lambda **k: [], trusts=self._trusts, set_tier=lambda *a, **k: None,
            import_decisions=lambda b: reply, import_erasures=lambda b: reply,
            add_rule=lambda *a, **k: reply)
        self.artifacts = SimpleNamespace(
            import_run=lambda r: reply,
            import_artifact=lambda a, chunks: (list(chunks), reply)[1],
            import_run_items=lambda **k: reply, forget_runs=lambda e: None)
        self.compactor = SimpleNamespace(import_iterations=lambda r, b: reply,
                                         forget_iterations=lambda e: None)
        self.on_trusts: Any = None

    def _trusts(self, fleet: str, ids: list[str]) -> list[Any]:
        self.trust_calls.append(ids)
        if self.on_trusts is not None:
            self.on_trusts()
        return []


class CountingReader(BundleReader):
    """Counts the rows each part has given so far."""

    read: dict[str, int]

    def rows(self, kind: str) -> Iterator[dict[str, Any]]:
        self.read = getattr(self, "read", {})
        for row in super().rows(kind):
            self.read[kind] = self.read.get(kind, 0) + 1
            yield row


def test_trust_rows_are_read_a_chunk_at_a_time(tmp_path: Path) -> None:
    """The pinned tiers are set 100 at a time as the part is read, never the whole part held
    (a bundle's trust part may be any size): when the first 100 are looked up, at most 100
    rows have been read."""
    out = tmp_path / "trust.bundle"
    bundle_with_part(out, "trust", [canonical_line(
        {"agent_id": f"agent-{i:05d}", "fleet_id": "fleet-a", "pinned": True,
         "tier": "TRUST_TIER_SUSPENDED"}) for i in range(1000)])
    clients = FakeClients()
    read_at_lookup: list[int] = []
    with CountingReader(out) as reader:
        reader.verify()
        clients.on_trusts = lambda: read_at_lookup.append(reader.read["trust"])
        report = Importer(clients).run(reader)  # type: ignore[arg-type]
    assert [len(ids) for ids in clients.trust_calls] == [100] * 10
    assert read_at_lookup == [100 * n for n in range(1, 11)]
    assert report.created["trust"] == 1000


def test_an_artifact_with_a_malformed_hash_is_a_bundle_error(tmp_path: Path) -> None:
    """blob_path refuses a hash that is not 64 lowercase hex (ValueError): the import stops
    with a BundleError naming the artifact, not a traceback."""
    out = tmp_path / "artifact.bundle"
    bundle_with_part(out, "artifacts", [canonical_line({"artifact_id": "a1", "hash": "../x"})])
    with BundleReader(out) as reader:
        reader.verify()
        with pytest.raises(BundleError, match=r"artifact a1's hash '\.\./x' is not"):
            Importer(FakeClients()).run(reader)  # type: ignore[arg-type]


def test_a_pinned_tier_outside_the_enum_is_a_bundle_error(tmp_path: Path) -> None:
    """Before, ``TIER_NAMES[99]`` ended the import with a KeyError traceback."""
    out = tmp_path / "tier.bundle"
    bundle_with_part(out, "trust", [canonical_line(
        {"agent_id": "rogue", "fleet_id": "fleet-a", "pinned": True, "tier": 99})])
    clients = FakeClients()
    set_tiers: list[Any] = []
    clients.governance.set_tier = lambda *a, **k: set_tiers.append(a)
    with BundleReader(out) as reader, pytest.raises(BundleError, match="agent 'rogue' holds "
                                                                        "tier 99, not one of"):
        reader.verify()
        Importer(clients).run(reader)  # type: ignore[arg-type]
    assert set_tiers == []
