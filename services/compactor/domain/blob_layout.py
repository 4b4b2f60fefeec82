"""Blob layouts of the warm and cold tiers: segment files, index files, gzip snapshots.

Everything here is a pure function of content, so rotation and snapshotting
are deterministic: the same iterations give byte-identical blobs (segment
names carry the first line's ``startTs``, gzip headers carry no time), and a
step redone after a crash writes exactly what the interrupted step would have.

    <fleet>/<run>/warm/segments/<seq>-<startTs>.jsonl   sealed warm segments
    <fleet>/<run>/warm/segments/<seq>-r<sha>.jsonl      one rewritten by an erasure in place
    <fleet>/<run>/warm/index/<version>.json             index file (newest wins)
    <fleet>/<run>/cold/<iteration>.json.gz              cold snapshots
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from services.common.canonical import canonical_json
from services.compactor.domain.warm_chain import WarmLine, sha256_hex

_GZIP_WBITS = 31
_CHUNK = 64 * 1024


def run_prefix(fleet_id: str, run_id: str) -> str:
    return f"{fleet_id}/{run_id}"


def segment_key(fleet_id: str, run_id: str, seq: int, first_start_ts: str) -> str:
    stamp = re.sub(r"[^0-9A-Za-z]", "", first_start_ts)[:20] or "nostart"
    return f"{run_prefix(fleet_id, run_id)}/warm/segments/{seq:06d}-{stamp}.jsonl"


def rewritten_segment_key(fleet_id: str, run_id: str, seq: int, sha256: str) -> str:
    """Where segment ``seq`` goes when an erasure rewrites it (a line in it tombstoned): named
    by its new content, so a rewrite redone after a crash lands on the same key, and by no
    line's ``startTs`` (the first line may be the one erased)."""
    return f"{run_prefix(fleet_id, run_id)}/warm/segments/{seq:06d}-r{sha256[:16]}.jsonl"


def index_key(fleet_id: str, run_id: str, version: int) -> str:
    return f"{run_prefix(fleet_id, run_id)}/warm/index/{version:06d}.json"


def snapshot_key(fleet_id: str, run_id: str, iteration: int) -> str:
    return f"{run_prefix(fleet_id, run_id)}/cold/{iteration:010d}.json.gz"


def segment_bytes(lines: Sequence[WarmLine]) -> bytes:
    return "".join(line.text() + "\n" for line in lines).encode()


def parse_segment(data: bytes) -> list[str]:
    return [line for line in data.decode(errors="replace").split("\n") if line]


@dataclass(frozen=True)
class SegmentEntry:
    """One sealed segment as the index file lists it."""

    seq: int
    key: str
    first_iter: int
    last_iter: int
    lines: int
    bytes: int
    sha256: str
    first_prev_hash: str
    last_hash: str


def index_document(fleet_id: str, run_id: str, version: int,
                   segments: Sequence[SegmentEntry]) -> bytes:
    return (canonical_json({
        "fleet": fleet_id, "run": run_id, "version": version,
        "segments": [asdict(s) for s in segments],
    }) + "\n").encode()


def parse_index(data: bytes) -> list[SegmentEntry]:
    document = json.loads(data)
    return [SegmentEntry(**entry) for entry in document["segments"]]


def snapshot_payload(fleet_id: str, run_id: str, line: WarmLine, detail_json: str,
                     guardrails_json: str) -> bytes:
    return canonical_json({
        "fleet": fleet_id, "run": run_id, "iter": line.iteration, "summary": line.to_dict(),
        "detail": json.loads(detail_json), "guardrails": json.loads(guardrails_json),
    }).encode()


def gzip_chunks(payload: bytes) -> Iterator[bytes]:
    """Stream a gzip member with no name and mtime 0."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
    for start in range(0, len(payload), _CHUNK):
        out = compressor.compress(payload[start:start + _CHUNK])
        if out:
            yield out
    yield compressor.flush()


@dataclass(frozen=True)
class SnapshotContent:
    iteration: int
    summary: WarmLine
    detail_json: str
    guardrails_json: str


def read_snapshot(data: bytes) -> SnapshotContent:
    """Decompress and parse a snapshot; raises ``ValueError`` when it is damaged."""
    try:
        document: dict[str, Any] = json.loads(zlib.decompress(data, _GZIP_WBITS))
        return SnapshotContent(
            iteration=int(document["iter"]),
            summary=WarmLine.from_dict(document["summary"]),
            detail_json=canonical_json(document["detail"]),
            guardrails_json=canonical_json(document["guardrails"]),
        )
    except (zlib.error, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"damaged snapshot: {exc}") from None


def digest_of(data: bytes) -> str:
    return sha256_hex(data)
