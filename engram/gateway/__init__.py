"""Engram's HTTP/JSON gateway (``engram gateway``): every annotated RPC of the four services
over HTTP, with the paths Envoy's gRPC-JSON transcoder would use, and an OpenAPI document.

It is a client of the services (``pip install 'engram[gateway]'``): the request's
``Authorization`` header goes through as gRPC metadata, so auth, the gate, trust and fleet
scoping apply as over gRPC.
"""

from engram.gateway._app import Gateway, GatewayConfig
from engram.gateway._errors import HTTP_STATUS, http_status, status_json
from engram.gateway._openapi import build_openapi
from engram.gateway._routes import PathTemplate, Route, load_routes
from engram.gateway._serve import serve
from engram.gateway._transcode import TranscodeError, build_request, to_json

__all__ = [
    "HTTP_STATUS",
    "Gateway",
    "GatewayConfig",
    "PathTemplate",
    "Route",
    "TranscodeError",
    "build_openapi",
    "build_request",
    "http_status",
    "load_routes",
    "serve",
    "status_json",
    "to_json",
]
