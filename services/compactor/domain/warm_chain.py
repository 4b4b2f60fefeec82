"""Warm summary lines and their hash chain (seed 003 plus the integrity follow-up).

A line is the canonical JSON of the seed's fields plus ``detailDigest``,
``prevHash`` and ``hash``; each line commits to its predecessor. The first line's
``prevHash`` is a run-specific genesis value: lines cannot be moved between runs.

Two formats live side by side (``v``, absent in format 1; docs/erasure.md):

- format 1 (lines recorded before salted commitments): ``detailDigest`` is the SHA-256 of the
  canonical detail and guardrails, ``hash`` the SHA-256 of the canonical JSON of every other
  field;
- format 2: the line carries a random ``salt``; ``summaryCommitment`` commits to the seed's
  fields and ``detailDigest`` to the detail (services/common/commitment.py), and ``hash`` is
  the SHA-256 of the canonical ``{v, iter, prevHash, summaryCommitment, detailDigest}``, so
  once a line and its salt are erased no kept hash confirms a guess of what it held.

A format-2 line erased in place (``engram forget --match``; docs/erasure.md) becomes its
tombstone: ``{v, iter, prevHash, summaryCommitment, detailDigest, hash}`` and the erasure
(``erasureId``, ``erasedUs``, ``erasedBy``), the seed's fields and the salt gone. Its hash
still follows from what it keeps, so the chain verifies through it; its commitments can no
longer be opened.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.common.canonical import canonical_json
from services.common.commitment import commitment, commits_to, is_salt
from services.common.erasure_source import is_erasure_id
from services.common.errors import InvalidArgument
from services.common.limits import check_limit, parse_json
from services.common.settings import LIMIT_DEFAULTS, LimitsSettings

_MAX_TEXT = 256
LINE_FORMAT = 2
"""The format new lines are recorded in."""
_SUMMARY_KEYS = ("planDigest", "parentDigest", "startTs", "endTs", "filesTouched", "netAdd",
                 "netDel", "riskScore", "status")


def sha256_hex(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def genesis_hash(fleet_id: str, run_id: str) -> str:
    return sha256_hex(f"engram.compactor.v1/{fleet_id}/{run_id}")


def detail_content(detail_json: str, guardrails_json: str) -> bytes:
    """The canonical bytes a line's ``detailDigest`` covers (format 1 hashes them, format 2
    commits to them)."""
    return canonical_json({"detail": json.loads(detail_json),
                           "guardrails": json.loads(guardrails_json)}).encode()


def canonical_detail_content(detail_json: str, guardrails_json: str) -> bytes:
    """``detail_content`` of values already in canonical form, without parsing them again."""
    return f'{{"detail":{detail_json},"guardrails":{guardrails_json}}}'.encode()


def detail_digest(detail_json: str, guardrails_json: str) -> str:
    """A format-1 line's ``detailDigest``: the plain SHA-256 of the detail."""
    return sha256_hex(detail_content(detail_json, guardrails_json))


def canonical_detail_digest(detail_json: str, guardrails_json: str) -> str:
    """``detail_digest`` of values already in canonical form, without parsing them again."""
    return sha256_hex(canonical_detail_content(detail_json, guardrails_json))


def detail_commitment(salt: str, detail_json: str, guardrails_json: str) -> str:
    """A format-2 line's ``detailDigest`` of canonical detail and guardrails under ``salt``."""
    return commitment(salt, canonical_detail_content(detail_json, guardrails_json))


def _summary_content(fields: dict[str, Any]) -> bytes:
    return canonical_json({key: fields[key] for key in _SUMMARY_KEYS}).encode()


def canonical_value(text: str, what: str, limits: LimitsSettings = LIMIT_DEFAULTS) -> str:
    """Parse a JSON value within the size and depth limits and return its canonical text,
    which is held to the size limit too: canonical numbers can be several times longer than
    sent (``1e15`` is ``1000000000000000.0``), and a 3.8 MiB detail was stored as 15 MB."""
    canonical = canonical_json(parse_json(text or "null", what, max_bytes=limits.json_bytes,
                                          setting="ENGRAM_LIMITS_JSON_BYTES",
                                          max_depth=limits.json_depth))
    check_limit(f"{what} in canonical form", len(canonical.encode()), limits.json_bytes,
                "ENGRAM_LIMITS_JSON_BYTES", "bytes")
    return canonical


@dataclass(frozen=True)
class IterationInput:
    """What a caller records: the seed's summary fields and the full detail."""

    iteration: int
    plan_digest: str
    parent_digest: str
    start_ts: str
    end_ts: str
    files_touched: int
    net_add: int
    net_del: int
    risk_score: float
    status: str
    detail_json: str
    guardrails_json: str

    def validated(self, limits: LimitsSettings = LIMIT_DEFAULTS) -> IterationInput:
        """A copy with canonical JSON detail; raises ``InvalidArgument`` on bad input."""
        if self.iteration < 0:
            raise InvalidArgument(f"iteration must be >= 1 (0 = next), got {self.iteration}")
        for name in ("plan_digest", "parent_digest", "start_ts", "end_ts", "status"):
            if len(getattr(self, name)) > _MAX_TEXT:
                raise InvalidArgument(f"{name} is longer than {_MAX_TEXT} characters")
        if not self.status:
            raise InvalidArgument("status is required (e.g. 'success', 'failed')")
        if min(self.files_touched, self.net_add, self.net_del) < 0:
            raise InvalidArgument("files_touched, net_add and net_del must be >= 0")
        if not math.isfinite(self.risk_score):
            raise InvalidArgument("risk_score must be a finite number")
        return IterationInput(
            **{**self.__dict__,
               "detail_json": canonical_value(self.detail_json, "detail_json", limits),
               "guardrails_json": canonical_value(self.guardrails_json, "guardrails_json",
                                                  limits)}
        )


@dataclass(frozen=True)
class WarmLine:
    iteration: int
    plan_digest: str
    parent_digest: str
    start_ts: str
    end_ts: str
    files_touched: int
    net_add: int
    net_del: int
    risk_score: float
    status: str
    detail_digest: str
    """Format 1: the detail's SHA-256; format 2: its commitment under ``salt``."""
    prev_hash: str
    hash: str
    format: int = 1
    salt: str = ""
    """Format 2: 32 random bytes as hex, stored in the line (erased with it)."""
    summary_commitment: str = ""
    """Format 2: the commitment to the seed's fields under ``salt``."""
    erasure_id: str = ""
    """Set on a tombstone: the erasure that erased the line in place (its seed fields, detail
    and salt are gone)."""
    erased_us: int = 0
    erased_by: str = ""

    @property
    def erased(self) -> bool:
        return bool(self.erasure_id)

    def tombstone(self, erasure_id: str, erased_us: int, erased_by: str) -> WarmLine:
        """This format-2 line erased: what the chain needs to go on, and who erased it."""
        if self.format != LINE_FORMAT:
            raise ValueError("only a format-2 line can be erased in place")
        return WarmLine.erased_line(self.iteration, self.detail_digest, self.prev_hash,
                                    self.hash, self.summary_commitment, erasure_id, erased_us,
                                    erased_by)

    @classmethod
    def erased_line(cls, iteration: int, detail_digest: str, prev_hash: str, hash_: str,
                    summary_commitment: str, erasure_id: str, erased_us: int, erased_by: str,
                    line_format: int = LINE_FORMAT) -> WarmLine:
        """A tombstone: the chain fields it keeps and the erasure, the seed's fields empty."""
        return cls(
            iteration=iteration, plan_digest="", parent_digest="", start_ts="", end_ts="",
            files_touched=0, net_add=0, net_del=0, risk_score=0.0, status="",
            detail_digest=detail_digest, prev_hash=prev_hash, hash=hash_, format=line_format,
            summary_commitment=summary_commitment, erasure_id=erasure_id, erased_us=erased_us,
            erased_by=erased_by)

    @classmethod
    def chained(cls, item: IterationInput, iteration: int, prev_hash: str,
                digest: str | None = None, salt: str = "") -> WarmLine:
        """The line recording ``item`` after ``prev_hash``: format 2 under ``salt``, format 1
        without one. ``digest`` is the line's ``detailDigest`` when the caller has it (an
        imported line whose detail is gone)."""
        if digest is None:
            digest = (detail_commitment(salt, item.detail_json, item.guardrails_json) if salt
                      else detail_digest(item.detail_json, item.guardrails_json))
        body = _body(iteration, item, digest, prev_hash)
        if not salt:
            return cls.from_dict({**body, "hash": sha256_hex(canonical_json(body))})
        body = {**body, "v": LINE_FORMAT, "salt": salt,
                "summaryCommitment": commitment(salt, _summary_content(body))}
        return cls.from_dict({**body, "hash": sha256_hex(canonical_json(_linked(body)))})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WarmLine:
        """The line ``data`` holds; raises ``ValueError`` for an unknown format, a format-1
        line carrying format-2 fields or a format-2 line without them."""
        line_format = data.get("v", 1)
        if type(line_format) is not int or line_format not in (1, LINE_FORMAT):
            raise ValueError(f"unknown warm line format {line_format!r}")
        if line_format == 1 and ("salt" in data or "summaryCommitment" in data):
            raise ValueError("a format-1 warm line carries no salt or commitment")
        if "erasureId" in data:
            if line_format != LINE_FORMAT or "salt" in data:
                raise ValueError("a warm line tombstone is format 2 and keeps no salt")
            return cls.erased_line(
                int(data["iter"]), str(data["detailDigest"]), str(data["prevHash"]),
                str(data["hash"]), str(data["summaryCommitment"]), str(data["erasureId"]),
                int(data["erasedUs"]), str(data["erasedBy"]))
        return cls(
            iteration=int(data["iter"]), plan_digest=str(data["planDigest"]),
            parent_digest=str(data["parentDigest"]), start_ts=str(data["startTs"]),
            end_ts=str(data["endTs"]), files_touched=int(data["filesTouched"]),
            net_add=int(data["netAdd"]), net_del=int(data["netDel"]),
            risk_score=float(data["riskScore"]), status=str(data["status"]),
            detail_digest=str(data["detailDigest"]), prev_hash=str(data["prevHash"]),
            hash=str(data["hash"]), format=line_format,
            salt=str(data["salt"]) if line_format == LINE_FORMAT else "",
            summary_commitment=(str(data["summaryCommitment"]) if line_format == LINE_FORMAT
                                else ""),
        )

    @classmethod
    def parse(cls, text: str) -> WarmLine:
        """Parse one JSONL line; raises ``ValueError`` when it is not a warm line."""
        try:
            return cls.from_dict(json.loads(text))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a warm summary line: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        if self.erased:
            return {"v": self.format, "iter": self.iteration, "prevHash": self.prev_hash,
                    "summaryCommitment": self.summary_commitment,
                    "detailDigest": self.detail_digest, "hash": self.hash,
                    "erasureId": self.erasure_id, "erasedUs": self.erased_us,
                    "erasedBy": self.erased_by}
        fields: dict[str, Any] = {
            "iter": self.iteration, "planDigest": self.plan_digest,
            "parentDigest": self.parent_digest, "startTs": self.start_ts, "endTs": self.end_ts,
            "filesTouched": self.files_touched, "netAdd": self.net_add, "netDel": self.net_del,
            "riskScore": self.risk_score, "status": self.status,
            "detailDigest": self.detail_digest, "prevHash": self.prev_hash, "hash": self.hash,
        }
        if self.format != 1:
            fields.update(v=self.format, salt=self.salt,
                          summaryCommitment=self.summary_commitment)
        return fields

    def text(self) -> str:
        """The JSONL line, without its newline."""
        return canonical_json(self.to_dict())

    def computed_hash(self) -> str:
        """The hash the line's fields give: format 1 over every field, format 2 over the
        chained ones (its commitments as stored; :meth:`intact` re-derives them)."""
        body = self.to_dict()
        del body["hash"]
        return sha256_hex(canonical_json(body if self.format == 1 else _linked(body)))

    def intact(self) -> bool:
        """Whether the line's fields give its hash; for format 2 also whether the seed's fields
        and the salt give its summaryCommitment (a change to either, to the commitment, or a
        salt that is not 64 lowercase hex is not intact). A tombstone is intact when what it
        kept gives its hash and it names an erasure (of the form governance issues) and a
        time."""
        if self.computed_hash() != self.hash:
            return False
        if self.erased:
            return is_erasure_id(self.erasure_id) and self.erased_us > 0
        return self.format == 1 or commits_to(self.salt, _summary_content(self.to_dict()),
                                              self.summary_commitment)

    def commits_detail(self, detail_json: str, guardrails_json: str) -> bool:
        """Whether the detail and guardrails (JSON values) are what ``detailDigest`` covers
        (never for a tombstone: its salt is gone)."""
        if self.erased:
            return False
        try:
            content = detail_content(detail_json, guardrails_json)
        except ValueError:
            return False
        if self.format == 1:
            return sha256_hex(content) == self.detail_digest
        return commits_to(self.salt, content, self.detail_digest)

    def same_content(self, item: IterationInput) -> bool:
        """Whether ``item`` is what this line recorded (a retry, not a conflict)."""
        if self.erased:
            return False
        theirs = WarmLine.chained(item, self.iteration, self.prev_hash, salt=self.salt) \
            if self.format == 1 or is_salt(self.salt) else None
        return theirs is not None and theirs.to_dict() == self.to_dict()


def _body(iteration: int, item: IterationInput, digest: str, prev_hash: str) -> dict[str, Any]:
    return {
        "iter": iteration, "planDigest": item.plan_digest, "parentDigest": item.parent_digest,
        "startTs": item.start_ts, "endTs": item.end_ts, "filesTouched": item.files_touched,
        "netAdd": item.net_add, "netDel": item.net_del, "riskScore": float(item.risk_score),
        "status": item.status, "detailDigest": digest, "prevHash": prev_hash,
    }


def _linked(body: dict[str, Any]) -> dict[str, Any]:
    """What a format-2 line's hash covers: its place in the chain and its commitments."""
    return {key: body[key]
            for key in ("v", "iter", "prevHash", "summaryCommitment", "detailDigest")}


@dataclass(frozen=True)
class ChainProblem:
    location: str
    detail: str


class ChainWalker:
    """Checks lines one after another: contiguous iterations, hashes, links."""

    def __init__(self, genesis: str) -> None:
        self.expected_prev = genesis
        self.expected_iter = 1
        self.checked = 0
        self.tombstones: list[WarmLine] = []
        """The tombstones fed (their erasures are checked against governance elsewhere)."""
        self.problems: list[ChainProblem] = []

    @property
    def tombstoned(self) -> int:
        return len(self.tombstones)

    def feed_text(self, location: str, text: str) -> WarmLine | None:
        try:
            line = WarmLine.parse(text)
        except ValueError as exc:
            self.problems.append(ChainProblem(location, f"unreadable line: {exc}"))
            return None
        self.feed(location, line)
        return line

    def feed(self, location: str, line: WarmLine) -> None:
        self.checked += 1
        if line.erased:
            self.tombstones.append(line)
        if line.iteration != self.expected_iter:
            self.problems.append(ChainProblem(
                location, f"expected iteration {self.expected_iter}, found {line.iteration} "
                "(a line was deleted, duplicated or reordered)"))
        if not line.intact():
            self.problems.append(ChainProblem(
                location, f"iteration {line.iteration}: line content does not match its hash "
                "or its commitment (tampered)" if not line.erased else
                f"iteration {line.iteration}: tombstone does not match its hash or names no "
                "erasure (tampered)"))
        if line.prev_hash != self.expected_prev:
            self.problems.append(ChainProblem(
                location, f"iteration {line.iteration}: prevHash does not link to the line "
                "before it"))
        self.expected_prev = line.hash
        self.expected_iter = line.iteration + 1

    def feed_all(self, location: str, lines: Iterable[WarmLine]) -> None:
        for line in lines:
            self.feed(f"{location} iteration {line.iteration}", line)
