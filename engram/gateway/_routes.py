"""The route table, read from the ``google.api.http`` annotations of the generated descriptors.

The protos are the one source of truth: each annotated method becomes one route per binding
(the main rule and its ``additional_bindings``), with the path template Envoy's gRPC-JSON
transcoder would match. A method without an annotation (``DecideWrites``) is not served.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType

from google.api import annotations_pb2, http_pb2
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.protobuf.message import Message

from engram.artifacts.v1 import artifacts_service_pb2
from engram.compactor.v1 import compactor_service_pb2
from engram.governance.v1 import governance_service_pb2
from engram.shard.v1 import shard_service_pb2

SERVICE_MODULES: Mapping[str, ModuleType] = {
    "shard": shard_service_pb2,
    "governance": governance_service_pb2,
    "artifacts": artifacts_service_pb2,
    "compactor": compactor_service_pb2,
}
"""Each backend (the key names its address in ``ClientSettings``) and its generated module."""

_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)(?:=([^}]*))?\}")
_HTTP_VERBS = ("get", "put", "post", "delete", "patch")


class TemplateError(ValueError):
    """An annotation whose path template this gateway cannot serve."""


@dataclass(frozen=True)
class PathTemplate:
    """``/v1/runs/{run_id}/events:replay``: literal segments, field variables, a verb."""

    template: str
    regex: re.Pattern[str]
    variables: tuple[str, ...]
    """Field paths bound by the path, in order (``header.run_id``)."""

    @classmethod
    def parse(cls, template: str) -> PathTemplate:
        if not template.startswith("/"):
            raise TemplateError(f"path template must start with '/': {template!r}")
        pattern, variables, position = "", list[str](), 0
        for match in _VARIABLE.finditer(template):
            pattern += re.escape(template[position:match.start()])
            field, segments = match.group(1), match.group(2) or "*"
            if segments == "*":
                body = "[^/]+"
            elif segments == "**":
                body = ".+"
            else:
                raise TemplateError(f"unsupported variable pattern {segments!r} in {template!r}")
            pattern += f"(?P<v{len(variables)}>{body})"
            variables.append(field)
            position = match.end()
        pattern += re.escape(template[position:])
        return cls(template, re.compile(pattern, re.DOTALL), tuple(variables))

    @property
    def has_verb(self) -> bool:
        """A custom method (``/v1/records:search``): matched before plain templates, since a
        plain ``{run_id}`` segment would also match ``x:rehydrate``."""
        last = self.template.rsplit("/", 1)[-1]
        return ":" in _VARIABLE.sub("", last)

    def match(self, path: str) -> dict[str, str] | None:
        found = self.regex.fullmatch(path)
        if found is None:
            return None
        return {field: found.group(f"v{i}") for i, field in enumerate(self.variables)}

    def openapi_path(self) -> str:
        """The template with each variable named by its last field name (``{run_id}`` for
        ``{header.run_id}``), so equal paths are one OpenAPI path item."""
        return _VARIABLE.sub(lambda m: "{" + openapi_name(m.group(1)) + "}", self.template)


def openapi_name(variable: str) -> str:
    return variable.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Route:
    """One HTTP binding of one RPC."""

    backend: str
    method: MethodDescriptor
    http_method: str
    path: PathTemplate
    body: str
    """``*`` (the whole request), a field name, or ``""`` (no body: query parameters)."""
    request_class: type[Message]
    response_class: type[Message]

    @property
    def grpc_path(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def client_streaming(self) -> bool:
        return bool(self.method.client_streaming)

    @property
    def server_streaming(self) -> bool:
        return bool(self.method.server_streaming)

    @property
    def operation_id(self) -> str:
        service = self.method.containing_service.name
        return f"{service}_{self.method.name}"

    @property
    def request_descriptor(self) -> Descriptor:
        descriptor: Descriptor = self.method.input_type
        return descriptor


def _bindings(rule: http_pb2.HttpRule) -> Iterable[tuple[str, str, str]]:
    pattern = rule.WhichOneof("pattern")
    if pattern in _HTTP_VERBS:
        yield pattern.upper(), getattr(rule, pattern), rule.body
    elif pattern == "custom":
        yield rule.custom.kind.upper(), rule.custom.path, rule.body
    for extra in rule.additional_bindings:
        yield from _bindings(extra)


def load_routes(modules: Mapping[str, ModuleType] = SERVICE_MODULES) -> list[Route]:
    """Every annotated method of every service, custom methods (``:verb``) first."""
    routes: list[Route] = []
    for backend, module in modules.items():
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                options = method.GetOptions()
                if not options.HasExtension(annotations_pb2.http):
                    continue
                rule = options.Extensions[annotations_pb2.http]
                request = message_factory.GetMessageClass(method.input_type)
                response = message_factory.GetMessageClass(method.output_type)
                for http_method, template, body in _bindings(rule):
                    routes.append(Route(backend, method, http_method, PathTemplate.parse(template),
                                        body, request, response))
    # Stable: custom methods first, then longer literal prefixes first.
    routes.sort(key=lambda r: (not r.path.has_verb, -len(r.path.template.split("{")[0])))
    return routes
