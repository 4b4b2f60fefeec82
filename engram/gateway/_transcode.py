"""HTTP request -> request message, response message -> JSON, as the transcoder does it.

The body (``*`` or one field), then the query parameters (for fields neither the body nor the
path bind), then the path variables are merged into one JSON object that protobuf's
``json_format`` parses with the canonical JSON mapping, so a wrong type or an unknown field is
a ``TranscodeError`` (400 INVALID_ARGUMENT), never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from engram.gateway._json_values import too_many_values
from engram.gateway._routes import Route

_INTEGERS = frozenset({
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
})
_FLOATS = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})
JsonObject = dict[str, Any]


class TranscodeError(ValueError):
    """The HTTP request does not make a valid request message (400 INVALID_ARGUMENT)."""

    def __init__(self, message: str, reason: str = "INVALID_REQUEST") -> None:
        super().__init__(message)
        self.reason = reason


def is_repeated(field: FieldDescriptor) -> bool:
    # protobuf 7 drops FieldDescriptor.label in favour of is_repeated.
    return bool(getattr(field, "is_repeated", False))


def field_at(descriptor: Descriptor, path: str) -> FieldDescriptor:
    """The field a dotted path (``header.run_id``, proto or JSON names) names."""
    field: FieldDescriptor | None = None
    current: Descriptor | None = descriptor
    for name in path.split("."):
        if current is None:
            raise TranscodeError(f"{path!r} goes through a field that is not a message")
        field = current.fields_by_name.get(name) or current.fields_by_camelcase_name.get(name)
        if field is None:
            raise TranscodeError(f"unknown field {path!r} in {descriptor.full_name}",
                                 reason="UNKNOWN_FIELD")
        current = field.message_type
    assert field is not None
    return field


def _scalar(field: FieldDescriptor, path: str, text: str) -> Any:
    """A path or query string as the JSON value the field's canonical mapping expects."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_BOOL:
        if text in ("true", "false"):
            return text == "true"
        raise TranscodeError(f"{path}: expected true or false, got {text!r}")
    if kind in _INTEGERS:
        try:
            return int(text)
        except ValueError:
            raise TranscodeError(f"{path}: expected an integer, got {text!r}") from None
    if kind in _FLOATS:
        if text in ("NaN", "Infinity", "-Infinity"):
            return text
        try:
            return float(text)
        except ValueError:
            raise TranscodeError(f"{path}: expected a number, got {text!r}") from None
    message = field.message_type
    if kind == FieldDescriptor.TYPE_MESSAGE and (message is None
                                                 or message.full_name not in _STRING_WKT):
        raise TranscodeError(f"{path}: a message field cannot be a path or query parameter; "
                             "set its own fields (name.subfield=...)")
    return text  # strings, bytes (base64), enums (by name or number), Timestamp, Duration


_STRING_WKT = frozenset({"google.protobuf.Timestamp", "google.protobuf.Duration",
                         "google.protobuf.FieldMask"})


def _place(target: JsonObject, descriptor: Descriptor, path: str, value: Any) -> None:
    node = target
    parts = path.split(".")
    current = descriptor
    for name in parts[:-1]:
        field = current.fields_by_name.get(name) or current.fields_by_camelcase_name.get(name)
        assert field is not None and field.message_type is not None
        child = node.setdefault(field.name, {})
        if not isinstance(child, dict):
            raise TranscodeError(f"{path}: {field.name} is not an object in the body")
        node, current = child, field.message_type
    leaf = current.fields_by_name.get(parts[-1]) or current.fields_by_camelcase_name[parts[-1]]
    node.pop(leaf.json_name, None)  # the path wins over the same field in the body
    node[leaf.name] = value


def parse_body(raw: bytes) -> Any:
    if not raw.strip():
        return {}
    problem = too_many_values(raw)  # before the parse, whose memory goes by value
    if problem is not None:
        raise TranscodeError(problem, reason="JSON_TOO_MANY_VALUES")
    try:
        return json.loads(raw)
    # ValueError: not UTF-8, not JSON, or an integer past Python's 4,300-digit limit
    except ValueError as error:
        raise TranscodeError(f"the body is not JSON: {error}", reason="INVALID_JSON") from None


def build_request(route: Route, path_params: Mapping[str, str],
                  query: Iterable[tuple[str, str]], body: Any,
                  query_prefix: str = "") -> Message:
    """The request message: body, then query parameters, then path variables."""
    descriptor = route.request_descriptor
    document: JsonObject
    if route.body == "*":
        if not isinstance(body, dict):
            raise TranscodeError("the body must be a JSON object", reason="INVALID_JSON")
        document = dict(body)
    elif route.body and not route.client_streaming:
        document = {field_at(descriptor, route.body).name: body}
    else:
        document = {}
    bound = {route.body.split(".")[0]} if route.body and route.body != "*" else set()
    if route.body != "*":
        repeated: dict[str, list[Any]] = {}
        for name, text in query:
            path = f"{query_prefix}{name}" if query_prefix and "." not in name else name
            if path.split(".")[0] in bound:
                raise TranscodeError(f"{name!r} is bound by the body, not a query parameter")
            field = field_at(descriptor, path)
            value = _scalar(field, name, text)
            if is_repeated(field):
                repeated.setdefault(path, []).append(value)
            else:
                _place(document, descriptor, path, value)
        for path, values in repeated.items():
            _place(document, descriptor, path, values)
    for path, text in path_params.items():
        _place(document, descriptor, path, _scalar(field_at(descriptor, path), path, text))
    message = route.request_class()
    try:
        json_format.ParseDict(document, message)
    except (json_format.ParseError, ValueError, TypeError, AttributeError) as error:
        raise TranscodeError(str(error)) from None
    return message


def to_json(message: Message) -> JsonObject:
    """Canonical proto3 JSON (lowerCamelCase, 64-bit integers as strings), with fields at their
    default value printed too, as Envoy's ``always_print_primitive_fields``."""
    result: JsonObject = json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True)
    return result
