"""In a versioned bucket (moto), nothing of an erased iteration survives as a noncurrent
version (found by review on 2026-11-29): retention purged no version of a retired cold
snapshot, so the detail of an iteration erased later stayed in the bucket; erasing a whole log
purged only the keys still current."""

from __future__ import annotations

import gzip
from dataclasses import replace

import pytest

from services.common.db import Database
from services.compactor.domain.model import TierConfig
from services.compactor.erasure import IterationEraser
from services.compactor.repository import CompactorRepository
from services.compactor.service import IterationLog
from tests.unit.compactor.support import RecordedErasures, make_iteration
from tests.versioned_s3 import versioned_store

F, R = "fleet-a", "run-v"
BUCKET = "versioned"
MARKER = "zqxversioned"


def _versions_holding(client: object, needle: str) -> list[tuple[str, bool]]:
    found = []
    listed = client.list_object_versions(Bucket=BUCKET)  # type: ignore[attr-defined]
    for version in listed.get("Versions", []):
        body = client.get_object(  # type: ignore[attr-defined]
            Bucket=BUCKET, Key=version["Key"], VersionId=version["VersionId"])["Body"].read()
        if version["Key"].endswith(".gz"):
            body = gzip.decompress(body)
        if needle.encode() in body:
            found.append((version["Key"], version["IsLatest"]))
    return found


@pytest.mark.parametrize("whole", [False, True], ids=["in-place", "whole-log"])
def test_no_version_of_an_erased_iteration_is_left(database: Database, whole: bool) -> None:
    with versioned_store(BUCKET) as (client, blobs):
        log = IterationLog(CompactorRepository(database), blobs,
                           TierConfig(hot_size=2, rotate_bytes=1024, snapshot_every=2,
                                      keep_snapshots=1))
        source = RecordedErasures(F)
        eraser = IterationEraser(log, database, blobs, source)
        for n in range(1, 9):
            item = make_iteration(n)
            if n == 2:
                item = replace(item, plan_digest=f"plan-{MARKER}")
            log.record(F, R, item)
        assert _versions_holding(client, MARKER)  # the retired snapshot of iteration 2 too
        if whole:
            head = log.verify(F, R)
            items = [("iterations", R, head.head_hash)]
        else:
            (found,), _ = eraser.find(F, MARKER, 10)
            items = [("iteration", f"{R}:{i.iteration}", i.leaf_hash) for i in found.iterations]
            assert [i.iteration for i in found.iterations] == [2]
        eraser.erase(F, source.add(items), 5)
        assert _versions_holding(client, MARKER) == []
