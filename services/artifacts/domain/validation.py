"""Input rules: identifiers, run-scoped names, JSON documents bounded to fit a row."""

from __future__ import annotations

import json

from services.common.blobstore import validate_key
from services.common.canonical import canonical_json
from services.common.errors import InvalidArgument

MAX_ID_LEN = 128
MAX_NAME_LEN = 512
MAX_TYPE_LEN = 128
MAX_MIME_LEN = 255
MAX_METADATA_BYTES = 16 * 1024
MAX_DOCUMENT_BYTES = 60 * 1024
"""Payloads, states and manifests; with the other columns a row stays under 64 KB."""
MAX_REFERENCES = 256
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@")


def identifier(kind: str, value: str) -> str:
    if not value or len(value) > MAX_ID_LEN:
        raise InvalidArgument(f"{kind} must be 1..{MAX_ID_LEN} characters, got {len(value)}",
                              reason="INVALID_IDENTIFIER")
    if not set(value) <= _ID_CHARS or value in (".", ".."):
        raise InvalidArgument(f"{kind} {value!r} may hold only letters, digits and - _ . : @",
                              reason="INVALID_IDENTIFIER")
    return value


def artifact_name(name: str) -> str:
    """A relative name inside a run and step; refuses traversal."""
    if len(name) > MAX_NAME_LEN:
        raise InvalidArgument(f"artifact name is {len(name)} characters; at most {MAX_NAME_LEN}",
                              reason="INVALID_ARTIFACT_NAME")
    try:
        return validate_key(name)
    except InvalidArgument as error:
        raise InvalidArgument(f"artifact name {name!r} is not a safe relative path: "
                              f"{error.message}", reason="INVALID_ARTIFACT_NAME") from None


def artifact_path(run_id: str, step_id: str, name: str) -> str:
    """The run-scoped blob key: ``runs/<run_id>/<step_id>/<name>``."""
    return f"runs/{identifier('run_id', run_id)}/{identifier('step_id', step_id)}/" \
        f"{artifact_name(name)}"


def json_document(kind: str, text: str, *, limit: int = MAX_DOCUMENT_BYTES,
                  default: str = "null", require_object: bool = False) -> str:
    """Parse, bound and canonicalise a JSON field; returns canonical text."""
    text = text.strip() or default
    if len(text.encode()) > limit * 4:
        raise InvalidArgument(f"{kind} is larger than {limit} bytes", reason="DOCUMENT_TOO_LARGE")
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
    size = len(canonical.encode())
    if size > limit:
        raise InvalidArgument(
            f"{kind} is {size} bytes; at most {limit} fit in a row (store larger content "
            "as an artifact and reference its id)", reason="DOCUMENT_TOO_LARGE",
            metadata={"limit_bytes": str(limit), "size_bytes": str(size)})
    return canonical


def metadata_object(text: str) -> str:
    return json_document("metadata_json", text, limit=MAX_METADATA_BYTES, default="{}",
                         require_object=True)


def short_text(kind: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidArgument(f"{kind} is {len(value)} characters; at most {limit}")
    return value


def references(kind: str, ids: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    if len(ids) > MAX_REFERENCES:
        raise InvalidArgument(f"at most {MAX_REFERENCES} {kind} per record, got {len(ids)}")
    return tuple(identifier(kind, i) for i in ids)
