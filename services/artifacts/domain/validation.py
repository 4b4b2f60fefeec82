"""Input rules: identifiers, fleet- and run-scoped names, JSON documents bounded to fit a row.

Every bound is a setting (:class:`ArtifactLimits` carries them from the settings to here);
going over one is ``INVALID_ARGUMENT`` naming the setting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.common.blobstore import validate_new_key
from services.common.canonical import canonical_json
from services.common.errors import InvalidArgument
from services.common.limits import (
    DEFAULT_JSON_DEPTH,
    LONE_SURROGATE_PROBLEM,
    LimitExceeded,
    check_limit,
    json_depth,
)
from services.common.tokens import validate_identifier

MAX_NAME_LEN = 512
MAX_SEGMENT_BYTES = 255
"""A file name's limit on Linux file systems (NAME_MAX): each part of an artifact name."""
MAX_TYPE_LEN = 128
MAX_MIME_LEN = 255
MAX_METADATA_BYTES = 16 * 1024
MAX_DOCUMENT_BYTES = 60 * 1024
"""Payloads, states and manifests; with the other columns a row stays under 64 KB."""
MAX_REFERENCES = 256
DEFAULT_MAX_UPLOAD_BYTES = 5 * 1024**3
DOCUMENT_SETTING = "ENGRAM_ARTIFACTS_MAX_DOCUMENT_BYTES"
METADATA_SETTING = "ENGRAM_ARTIFACTS_MAX_METADATA_BYTES"
UPLOAD_SETTING = "ENGRAM_ARTIFACTS_MAX_UPLOAD_BYTES"
DEPTH_SETTING = "ENGRAM_LIMITS_JSON_DEPTH"


@dataclass(frozen=True)
class ArtifactLimits:
    """The bounds on what one request may carry (each one a setting, named in refusals)."""

    document_bytes: int = MAX_DOCUMENT_BYTES
    metadata_bytes: int = MAX_METADATA_BYTES
    json_depth: int = DEFAULT_JSON_DEPTH
    upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    batch_items: int = 1000
    """Items in one ImportRunItems call (ENGRAM_LIMITS_BATCH_ITEMS)."""

    def document(self, kind: str, text: str, default: str = "null") -> str:
        return json_document(kind, text, limit=self.document_bytes, setting=DOCUMENT_SETTING,
                             max_depth=self.json_depth, default=default)

    def metadata(self, text: str) -> str:
        return metadata_object(text, limit=self.metadata_bytes, max_depth=self.json_depth)

    def check_upload(self, size_bytes: int) -> None:
        check_limit("the upload", size_bytes, self.upload_bytes, UPLOAD_SETTING, "bytes")


def identifier(kind: str, value: str) -> str:
    """An id: 1..128 letters, digits and - _ . : @, not only dots (no NUL, no control
    characters, no ``/``): the rule every service applies, with this service's reason."""
    try:
        return validate_identifier(kind, value)
    except InvalidArgument as error:
        raise InvalidArgument(error.message, reason="INVALID_IDENTIFIER") from None


def artifact_name(name: str) -> str:
    """A relative name inside a run and step; refuses traversal, and a name no store can hold:
    over ``MAX_NAME_LEN`` UTF-8 bytes (the blob key must fit S3's 1024), or with a part between
    slashes over ``MAX_SEGMENT_BYTES`` (a file system's name limit). Before 2026-11-29 such a
    part failed in the store, INTERNAL after the whole upload (found by a review)."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if len(name) > MAX_NAME_LEN or size > MAX_NAME_LEN:
        raise InvalidArgument(f"artifact name is {size} bytes; at most {MAX_NAME_LEN}",
                              reason="INVALID_ARTIFACT_NAME")
    try:
        key = validate_new_key(name)
    except InvalidArgument as error:
        raise InvalidArgument(f"artifact name {name!r} is not a safe relative path: "
                              f"{error.message}", reason="INVALID_ARTIFACT_NAME") from None
    for part in key.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            raise InvalidArgument(f"artifact name part {part[:40]!r}… is over "
                                  f"{MAX_SEGMENT_BYTES} bytes, more than a file name may have",
                                  reason="INVALID_ARTIFACT_NAME")
    return key


def artifact_path(fleet_id: str, run_id: str, step_id: str, artifact_id: str,
                  name: str) -> str:
    """The blob key: ``fleets/<fleet>/runs/<run>/<step>/<artifact_id>/<name>``.

    The fleet keeps two fleets' runs of one id apart; the artifact id gives every upload a
    key of its own, so a losing concurrent upload of one name never touches the winner's blob.
    Rows stored before fleets scoped runs keep their ``runs/<run>/<step>/<name>`` keys.
    """
    return (f"fleets/{identifier('fleet_id', fleet_id)}/runs/{identifier('run_id', run_id)}/"
            f"{identifier('step_id', step_id)}/{artifact_id}/{artifact_name(name)}")


def _too_large(kind: str, size: int, limit: int, setting: str) -> LimitExceeded:
    return LimitExceeded(
        f"{kind} is {size} bytes, over the limit of {limit} bytes ({setting}); store larger "
        "content as an artifact and reference its id", reason="DOCUMENT_TOO_LARGE",
        metadata={"limit": str(limit), "setting": setting, "size_bytes": str(size)})


def json_document(kind: str, text: str, *, limit: int = MAX_DOCUMENT_BYTES,
                  setting: str = DOCUMENT_SETTING, max_depth: int = DEFAULT_JSON_DEPTH,
                  default: str = "null", require_object: bool = False) -> str:
    """Parse, bound and canonicalise a JSON field; returns canonical text.

    Size and depth are checked before parsing (a deep document would exhaust the parser's
    recursion); NUL is refused anywhere in it (Postgres' JSON columns cannot hold it, and one
    rule for every document is simpler to state); so is a lone surrogate escape
    (``"\\ud800"``: valid JSON text, but no character, so the canonical text has no UTF-8
    form to store or hash).
    """
    text = text.strip() or default
    raw = len(text.encode())
    if raw > limit * 4:
        raise _too_large(kind, raw, limit, setting)
    check_limit(f"{kind}'s nesting depth", json_depth(text), max_depth, DEPTH_SETTING)
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidArgument(f"{kind} is not valid JSON: {error}", reason="INVALID_JSON") from None
    if require_object and not isinstance(value, dict):
        raise InvalidArgument(f"{kind} must be a JSON object", reason="INVALID_JSON")
    try:
        canonical = canonical_json(value)
    except ValueError:
        raise InvalidArgument(f"{kind} is not valid JSON: NaN and infinite numbers (NaN, "
                              "Infinity, 1e999) have no JSON form", reason="INVALID_JSON") from None
    if _holds_nul(value):
        raise InvalidArgument(f"{kind} holds a NUL character (\\u0000), which cannot be "
                              "stored", reason="NUL_CHARACTER")
    try:
        size = len(canonical.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"{kind} is not valid JSON: {LONE_SURROGATE_PROBLEM}",
                              reason="INVALID_JSON") from None
    if size > limit:
        raise _too_large(kind, size, limit, setting)
    return canonical


def _holds_nul(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def metadata_object(text: str, *, limit: int = MAX_METADATA_BYTES,
                    max_depth: int = DEFAULT_JSON_DEPTH) -> str:
    return json_document("metadata_json", text, limit=limit, setting=METADATA_SETTING,
                         max_depth=max_depth, default="{}", require_object=True)


def short_text(kind: str, value: str, limit: int) -> str:
    """Free text (a reason, a MIME type, an event type): bounded, and no NUL."""
    if len(value) > limit:
        raise InvalidArgument(f"{kind} is {len(value)} characters; at most {limit}")
    if "\x00" in value:
        raise InvalidArgument(f"{kind} holds a NUL character, which cannot be stored",
                              reason="NUL_CHARACTER")
    return value


def references(kind: str, ids: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    if len(ids) > MAX_REFERENCES:
        raise InvalidArgument(f"at most {MAX_REFERENCES} {kind} per record, got {len(ids)}")
    return tuple(identifier(kind, i) for i in ids)
