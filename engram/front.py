"""The front proxy: an nginx configuration that refuses a service's excess calls before they
reach its Python process (docs/reliability.md, "Overload").

A refusal inside the service costs gRPC's Python call handling about 0.6 ms of CPU and a turn
at the interpreter lock, so under twice its capacity the well-behaved callers waited behind
the refusals (fault test 6). nginx, beside the service (a sidecar in Kubernetes, a process
here), counts the calls in flight, in all and per caller, and answers the one over either
limit itself, in C: ``RESOURCE_EXHAUSTED`` with ``ErrorInfo`` reason ``OVERLOADED`` and
``RetryInfo``, the same status, reason and details the service's own admission sends, so a
client needs nothing new. What passes is the service's own business: it still authenticates
every call, rate-limits each agent and runs its own admission.

A caller is its token: the last 64 base64url characters of its signature (nginx counts only
keys of at most 255 bytes, and a token is longer), whatever the service also accepts around
them (trailing spaces, ``==`` padding) left out, so one token cannot pass as several callers.
A header of any other form (none, or not ending in a signature) is one caller for all of
them: each such call is refused by the service anyway. A forged token is a caller of its own
here, bounded by the total limit, and the service refuses it.

Every HTTP/2 stream counts as a connection for nginx's ``limit_conn``, so "in flight" means
calls, not TCP connections.
"""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass

from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

ERROR_DOMAIN = "engram.dev"
"""As services.common.errors.ERROR_DOMAIN (not imported: the CLI runs without the server
extra)."""
CALLER_KEY_CHARS = 64
MAX_RETRY_MS = 60_000


class FrontConfigError(ValueError):
    """An argument the configuration cannot be made from; the message says which and why."""


@dataclass(frozen=True)
class FrontLimits:
    max_in_flight: int = 16
    """Calls in flight to the service, all callers together; one more is refused."""
    per_caller_in_flight: int = 4
    """Calls in flight one caller (token) may have; one more is refused."""
    retry_after_ms: int = 50
    """The delay RetryInfo asks a refused caller to wait."""

    def check(self) -> None:
        if self.max_in_flight < 1:
            raise FrontConfigError(f"--max-in-flight must be at least 1, got {self.max_in_flight}")
        if not 1 <= self.per_caller_in_flight <= self.max_in_flight:
            raise FrontConfigError(
                f"--per-caller-in-flight must be from 1 to --max-in-flight "
                f"({self.max_in_flight}), got {self.per_caller_in_flight}")
        if not 1 <= self.retry_after_ms <= MAX_RETRY_MS:
            raise FrontConfigError(f"--retry-after-ms must be from 1 to {MAX_RETRY_MS}, got "
                                   f"{self.retry_after_ms}")


def host_port(value: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) checked, so nothing the operator typed is pasted into
    the configuration unchecked."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise FrontConfigError(f"{what} must be HOST:PORT with a port from 1 to 65535, got "
                               f"{value!r}")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        labels = bare.split(".")
        if not all(label and len(label) <= 63 and label.replace("-", "").isalnum()
                   and label.isascii() for label in labels) or len(bare) > 253:
            raise FrontConfigError(f"{what}: {host!r} is neither an IP address nor a host "
                                   f"name") from None
    return host, int(port_text)


def refusal_details(limits: FrontLimits) -> str:
    """``grpc-status-details-bin`` of a refusal: a ``google.rpc.Status`` with the ErrorInfo and
    RetryInfo the service's own admission sends, base64 without padding (gRPC's binary
    header form)."""
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=_REFUSAL_MESSAGE)
    info = error_details_pb2.ErrorInfo(
        reason="OVERLOADED", domain=ERROR_DOMAIN,
        metadata={"limit": "front proxy", "max_in_flight": str(limits.max_in_flight),
                  "per_caller_in_flight": str(limits.per_caller_in_flight)})
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
        seconds=limits.retry_after_ms // 1000, nanos=limits.retry_after_ms % 1000 * 1_000_000))
    for detail in (info, retry):
        packed = any_pb2.Any()
        packed.Pack(detail, deterministic=True)
        status.details.append(packed)
    return base64.b64encode(status.SerializeToString(deterministic=True)).decode().rstrip("=")


_BAD_REQUEST_MESSAGE = ("the front proxy refused the request's headers (more than one "
                        "authorization header, or a malformed one); send exactly one "
                        "'authorization: Bearer <token>'")
_UNAVAILABLE_MESSAGE = "the service behind the front proxy did not answer; retry"
_REFUSAL_MESSAGE = ("the service is at its limit of calls in flight (in all, or for this "
                    "caller) at its front proxy; retry after the delay in RetryInfo")


def render(upstream: str, listen: str, limits: FrontLimits, *, workers: int = 1,
           state_dir: str = "/tmp") -> str:
    """The nginx configuration: gRPC on ``listen`` (plaintext HTTP/2) to ``upstream``.

    ``state_dir`` holds the pid file and nginx's temporary files (the Kubernetes sidecar runs
    with a read-only root file system and ``/tmp`` an emptyDir)."""
    limits.check()
    up_host, up_port = host_port(upstream, "--upstream")
    in_host, in_port = host_port(listen, "--listen")
    if workers < 1:
        raise FrontConfigError(f"--workers must be at least 1, got {workers}")
    if not state_dir.startswith("/") or any(c in state_dir for c in ' ;{}"\'\\$\n'):
        raise FrontConfigError(f"--state-dir must be an absolute path without spaces, quotes, "
                               f"';', '{{', '}}' or '$', got {state_dir!r}")
    details = refusal_details(limits)
    return f"""\
# Engram front proxy (generated by `engram front-config`; docs/reliability.md, "Overload").
# Refuses calls over {limits.max_in_flight} in flight in all, or over
# {limits.per_caller_in_flight} for one token, with RESOURCE_EXHAUSTED OVERLOADED and RetryInfo,
# before they reach the service at {up_host}:{up_port}.
worker_processes {workers};
daemon off;
pid {state_dir}/engram-front.pid;
error_log stderr warn;

events {{
    worker_connections 8192;
}}

http {{
    access_log off;
    client_body_temp_path {state_dir}/engram-front-body;
    proxy_temp_path {state_dir}/engram-front-proxy;
    fastcgi_temp_path {state_dir}/engram-front-fastcgi;
    uwsgi_temp_path {state_dir}/engram-front-uwsgi;
    scgi_temp_path {state_dir}/engram-front-scgi;

    # A caller is its token's signature: its last {CALLER_KEY_CHARS} base64url characters,
    # without the padding and trailing spaces the service also accepts (nginx counts keys of
    # at most 255 bytes). Any other header, or none: one caller for all of them.
    map $http_authorization $engram_caller {{
        "~(?<signature>[A-Za-z0-9_-]{{{CALLER_KEY_CHARS}}})=*[ \\t]*$" $signature;
        default not-a-token;
    }}
    map $http_authorization $engram_everyone {{
        default all;
    }}
    limit_conn_zone $engram_everyone zone=engram_all:1m;
    limit_conn_zone $engram_caller zone=engram_caller:16m;

    upstream engram_service {{
        server {up_host}:{up_port};
        keepalive 64;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}

    server {{
        listen {in_host}:{in_port} http2;
        http2_max_concurrent_streams 1024;
        keepalive_requests 1000000;
        # The service enforces its own message limits (ENGRAM_MAX_MESSAGE_BYTES).
        client_max_body_size 0;
        client_body_timeout 300s;
        # Header fields as large as the service takes (it answers a too-large one for that
        # call); nginx's 4k/8k defaults ended the whole connection (GOAWAY), every call on it.
        large_client_header_buffers 8 64k;
        # Metadata keys with '_' pass as the service would see them (nginx drops them).
        underscores_in_headers on;

        # HTTP/2: each call in flight counts as a connection.
        limit_conn engram_all {limits.max_in_flight};
        limit_conn engram_caller {limits.per_caller_in_flight};
        limit_conn_status 429;
        limit_conn_log_level info;
        # A request nginx refuses itself (more than one authorization header, a malformed
        # one): a gRPC status, not an HTTP 400 a client reports as INTERNAL.
        error_page 400 = @engram_bad_request;

        location / {{
            grpc_pass grpc://engram_service;
            grpc_read_timeout 3600s;
            grpc_send_timeout 3600s;
            error_page 400 = @engram_bad_request;
            error_page 429 = @engram_overloaded;
            error_page 502 503 504 = @engram_unavailable;
        }}

        location @engram_overloaded {{
            default_type application/grpc;
            add_header grpc-status 8 always;
            add_header grpc-message "{_REFUSAL_MESSAGE}" always;
            add_header grpc-status-details-bin "{details}" always;
            return 204;
        }}

        location @engram_bad_request {{
            default_type application/grpc;
            add_header grpc-status 3 always;
            add_header grpc-message "{_BAD_REQUEST_MESSAGE}" always;
            return 204;
        }}

        location @engram_unavailable {{
            default_type application/grpc;
            add_header grpc-status 14 always;
            add_header grpc-message "{_UNAVAILABLE_MESSAGE}" always;
            return 204;
        }}
    }}
}}
"""
