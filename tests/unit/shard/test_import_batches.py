"""`engram shard import` keeps each batch call under the servers' request limit."""

from __future__ import annotations

from itertools import pairwise

from engram.cli.shard import IMPORT_BATCH_BYTES, _batches
from engram.client import record_input
from engram.client._channel import MAX_SEND_BYTES


def test_batches_split_by_count_and_by_bytes() -> None:
    small = [record_input(f"memory {i}") for i in range(450)]
    assert _batches(small, 200, IMPORT_BATCH_BYTES) == [(0, 200), (200, 400), (400, 450)]
    large = [record_input("x" * 32_000, metadata={"k": "v" * 8000}) for _ in range(200)]
    bounds = _batches(large, 200, IMPORT_BATCH_BYTES)
    assert bounds[0][0] == 0 and bounds[-1][1] == 200
    assert all(a[1] == b[0] for a, b in pairwise(bounds))
    for start, end in bounds:
        assert sum(m.ByteSize() + 8 for m in large[start:end]) <= IMPORT_BATCH_BYTES
    assert IMPORT_BATCH_BYTES < MAX_SEND_BYTES
    assert _batches([], 200, IMPORT_BATCH_BYTES) == []
