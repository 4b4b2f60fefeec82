"""OpenTelemetry tracing for the services: off unless an OTLP endpoint is set.

``OTEL_EXPORTER_OTLP_ENDPOINT`` (OpenTelemetry's own variable, e.g. http://collector:4317)
turns it on: :func:`configure_tracing` sets a tracer provider that batches spans to that
collector over OTLP/gRPC, named ``engram-<service>``. Then every RPC a service serves is a
server span (the caller's context continued from the call's metadata), every call it makes to
another service a client span (:func:`engram.client._tracing.traced`), and each JSON log line
written inside a span carries its ``trace_id`` and ``span_id``. Off, none of this is installed
on the call path.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import grpc

from engram.client._tracing import tracing_active

log = logging.getLogger("engram.tracing")
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"


def configure_tracing(service: str) -> bool:
    """Set the process's tracer provider if an OTLP endpoint is configured; whether it did."""
    endpoint = os.environ.get(ENDPOINT_ENV, "").strip()
    if not endpoint:
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"engram-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    log.info("tracing to %s", endpoint)
    return True


def server_interceptors() -> list[grpc.ServerInterceptor[Any, Any]]:
    """OpenTelemetry's server interceptor when tracing is active, else nothing."""
    if not tracing_active():
        return []
    from opentelemetry.instrumentation.grpc import server_interceptor

    interceptor: grpc.ServerInterceptor[Any, Any] = server_interceptor()  # type: ignore[no-untyped-call]
    return [interceptor]
