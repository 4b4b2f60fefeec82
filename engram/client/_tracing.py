"""Client-side tracing: a channel carries the caller's trace when the process traces.

Nothing happens unless OpenTelemetry's SDK is installed and a tracer provider is set (the
services set one when an OTLP endpoint is configured; an application may set its own): then
every call on a channel the SDK opens is a client span, and its context travels in the call's
metadata, so a write's trace runs from the caller through the shard into governance.
"""

from __future__ import annotations

from typing import Any

import grpc


def tracing_active() -> bool:
    """Whether this process records traces (an SDK tracer provider is set)."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:  # the client installed without OpenTelemetry
        return False
    return isinstance(trace.get_tracer_provider(), TracerProvider)


def traced(channel: grpc.Channel) -> grpc.Channel:
    """``channel`` with OpenTelemetry's client interceptor when tracing is active."""
    if not tracing_active():
        return channel
    from opentelemetry.instrumentation.grpc import client_interceptor
    from opentelemetry.instrumentation.grpc.grpcext import intercept_channel

    intercepted: Any = intercept_channel(channel, client_interceptor())  # type: ignore[no-untyped-call]
    return intercepted  # type: ignore[no-any-return]
