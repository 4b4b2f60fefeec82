"""An OpenAPI 3.1 document built from the same descriptors and annotations as the routes.

Messages become schemas under their full proto name, in the canonical JSON mapping
(lowerCamelCase names, 64-bit integers as strings, enums by name, Timestamp as RFC 3339).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from engram.gateway._routes import Route, openapi_name
from engram.gateway._transcode import field_at, is_repeated

JsonObject = dict[str, Any]
STATUS_SCHEMA = "google.rpc.Status"
_REF = "#/components/schemas/"

_INT32 = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32}
_UINT32 = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32}
_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64}
_UINT64 = {FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64}
_WELL_KNOWN: dict[str, JsonObject] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]+)?s$"},
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
    "google.protobuf.Empty": {"type": "object"},
}


def _scalar_schema(field: FieldDescriptor, *, accept_numbers: bool) -> JsonObject:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return {"type": "string"}
    if kind == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    if kind == FieldDescriptor.TYPE_BYTES:
        return {"type": "string", "format": "byte"}
    if kind in _INT32:
        return {"type": "integer", "format": "int32", "minimum": -(2**31), "maximum": 2**31 - 1}
    if kind in _UINT32:
        return {"type": "integer", "format": "uint32", "minimum": 0, "maximum": 2**32 - 1}
    if kind in _INT64 | _UINT64:
        # Canonical JSON writes 64-bit integers as decimal strings; readers accept numbers too.
        pattern = r"^[0-9]{1,19}$" if kind in _UINT64 else r"^-?[0-9]{1,18}$"
        text = {"type": "string", "format": "int64", "pattern": pattern}
        if not accept_numbers:
            return text
        return {"oneOf": [text, {"type": "integer", "minimum": -(2**53), "maximum": 2**53}]}
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return {"type": "number", "format": "double" if kind == FieldDescriptor.TYPE_DOUBLE
                else "float"}
    if kind == FieldDescriptor.TYPE_ENUM:
        values = field.enum_type.values if field.enum_type is not None else []
        return {"type": "string", "enum": [value.name for value in values]}
    raise ValueError(f"no schema for field type {kind}")


class SchemaSet:
    """The components.schemas of the document, each message added once."""

    def __init__(self) -> None:
        self.schemas: dict[str, JsonObject] = {}

    def ref(self, descriptor: Descriptor) -> JsonObject:
        if descriptor.full_name in _WELL_KNOWN:
            return dict(_WELL_KNOWN[descriptor.full_name])
        if descriptor.full_name not in self.schemas:
            self.schemas[descriptor.full_name] = {}  # placeholder: recursion stops here
            self.schemas[descriptor.full_name] = self._message(descriptor)
        return {"$ref": _REF + descriptor.full_name}

    def field_schema(self, field: FieldDescriptor) -> JsonObject:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value = field.message_type.fields_by_name["value"]
            return {"type": "object", "additionalProperties": self._single(value)}
        single = self._single(field)
        return {"type": "array", "items": single} if is_repeated(field) else single

    def _single(self, field: FieldDescriptor) -> JsonObject:
        if field.message_type is not None:
            return self.ref(field.message_type)
        return _scalar_schema(field, accept_numbers=True)

    def _message(self, descriptor: Descriptor) -> JsonObject:
        properties = {field.json_name: self.field_schema(field) for field in descriptor.fields}
        return {"type": "object", "properties": properties, "additionalProperties": False}


def _status_schemas() -> dict[str, JsonObject]:
    return {
        STATUS_SCHEMA: {
            "type": "object",
            "description": "A failure: the gRPC code, a readable message and details "
                           "(google.rpc.ErrorInfo with the reason, as Any JSON).",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "integer", "format": "int32"},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {"$ref": _REF + "google.protobuf.Any"}},
            },
        },
        "google.protobuf.Any": {
            "type": "object", "required": ["@type"],
            "properties": {"@type": {"type": "string"}}, "additionalProperties": True,
        },
    }


def _query_parameters(route: Route, schemas: SchemaSet, bound: set[str]) -> list[JsonObject]:
    """Every scalar (or repeated scalar) field not bound by the path, one level of nesting
    deep (``header.step_id``), as the transcoder reads query parameters."""
    parameters: list[JsonObject] = []

    def walk(descriptor: Descriptor, prefix: str, depth: int) -> None:
        for field in descriptor.fields:
            name = prefix + field.name
            if name in bound:
                continue
            message = field.message_type
            if message is not None and message.full_name not in _WELL_KNOWN:
                if depth < 1 and not is_repeated(field):
                    walk(message, name + ".", depth + 1)
                continue
            if message is not None:
                schema = dict(_WELL_KNOWN[message.full_name])
            else:
                schema = _scalar_schema(field, accept_numbers=False)
                if "oneOf" in schema:
                    schema = schema["oneOf"][0]
            if is_repeated(field):
                schema = {"type": "array", "items": schema}
            parameters.append({"name": name, "in": "query", "required": False,
                               "schema": schema, "explode": True})

    walk(route.request_descriptor, "", 0)
    return parameters


def _path_parameter(route: Route, variable: str) -> JsonObject:
    field = field_at(route.request_descriptor, variable)
    schema = _scalar_schema(field, accept_numbers=False) if field.message_type is None else {
        "type": "string"}
    if schema.get("type") == "string":
        # A path segment: not empty, no '/' (and no ':' that would read as a custom verb).
        schema = {**schema, "pattern": schema.get("pattern", r"^[^/:]+$"), "minLength": 1}
    return {"name": openapi_name(variable), "in": "path", "required": True, "schema": schema}


def _upload_operation(route: Route, schemas: SchemaSet) -> JsonObject:
    bound = set(route.path.variables)
    header = route.request_descriptor.fields_by_name["header"].message_type
    assert header is not None
    parameters = [_path_parameter(route, v) for v in route.path.variables]
    for field in header.fields:
        if f"header.{field.name}" in bound:
            continue
        schema = _scalar_schema(field, accept_numbers=False)
        parameters.append({"name": field.name, "in": "query", "required": field.name == "name",
                           "schema": schema.get("oneOf", [schema])[0]})
    return {
        "parameters": parameters,
        "requestBody": {"required": True, "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        "responses": _responses(route, schemas),
        "description": "The request body is the artifact's bytes, streamed to the service; "
                       "Content-Type is its mime_type and X-Engram-Sha256 its expected hash "
                       "unless query parameters say otherwise.",
    }


def _responses(route: Route, schemas: SchemaSet) -> JsonObject:
    error = {"description": "A google.rpc.Status; the HTTP status follows its code.",
             "content": {"application/json": {"schema": {"$ref": _REF + STATUS_SCHEMA}}}}
    output = route.method.output_type
    if route.server_streaming and "chunk" in output.fields_by_name:
        ok: JsonObject = {
            "description": "The bytes; the metadata in X-Engram-Artifact (JSON), ETag and "
                           "Content-Length.",
            "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                  "format": "binary"}}}}
    elif route.server_streaming:
        ok = {"description": f"Newline-delimited JSON: one {output.name} per line; a failure "
                             "after the first line is a last line {\"error\": Status}.",
              "content": {"application/x-ndjson": {"schema": schemas.ref(output)}}}
    else:
        ok = {"description": output.name,
              "content": {"application/json": {"schema": schemas.ref(output)}}}
    return {"200": ok, "default": error}


def build_openapi(routes: list[Route], *, title: str = "Engram HTTP/JSON gateway",
                  version: str = "v1") -> JsonObject:
    schemas = SchemaSet()
    paths: dict[str, JsonObject] = {}
    for route in routes:
        operation_id = route.operation_id
        item = paths.setdefault(route.path.openapi_path(), {})
        if route.client_streaming:
            operation = _upload_operation(route, schemas)
        else:
            bound = set(route.path.variables)
            parameters = [_path_parameter(route, v) for v in route.path.variables]
            operation = {"parameters": parameters, "responses": _responses(route, schemas)}
            if route.body == "*":
                operation["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": schemas.ref(route.request_descriptor)}}}
            else:
                if route.body:
                    body_field = route.request_descriptor.fields_by_name[route.body]
                    operation["requestBody"] = {"required": True, "content": {
                        "application/json": {"schema": schemas.field_schema(body_field)}}}
                    bound.add(route.body)
                parameters.extend(_query_parameters(route, schemas, bound))
        if sum(1 for r in routes if r.method is route.method) > 1:
            operation_id += f"_{route.http_method.lower()}"
        comments = route.method.containing_service.name + "." + route.method.name
        operation.update({"operationId": operation_id, "summary": comments,
                          "tags": [route.method.containing_service.name]})
        item[route.http_method.lower()] = operation
    schemas.schemas.update(_status_schemas())
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "Generated from the google.api.http annotations of Engram's "
                                "protos; every operation calls one gRPC method."},
        "paths": paths,
        "components": {
            "schemas": schemas.schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "bearerFormat": "Engram token (Ed25519-signed)"}},
        },
        "security": [{"bearer": []}],
    }
