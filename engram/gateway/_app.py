"""The gateway as an ASGI app: routes from the annotations, one gRPC channel per service."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import queue
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import grpc
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as StarletteRoute
from starlette.types import Receive, Scope, Send

from engram.artifacts.v1 import artifacts_service_pb2 as artifacts_pb
from engram.client import ClientSettings
from engram.client._bearer import bearer_of, malformed_authorization
from engram.client.artifacts import MIME_TYPE
from engram.gateway._budget import BodyBudget, BodyLease, BodyRefused, token_holder
from engram.gateway._errors import http_status, status_from_rpc_error, status_json, status_of
from engram.gateway._holders import BodyHolders, token_key_sources
from engram.gateway._openapi import build_openapi
from engram.gateway._routes import Route, load_routes
from engram.gateway._transcode import TranscodeError, build_request, parse_body, to_json
from services.common.settings import TokenKeySettings

log = logging.getLogger("engram.gateway")

NDJSON = "application/x-ndjson"
UPLOAD_CHUNK = 256 * 1024
"""Bytes per gRPC message on upload: the HTTP body is re-cut to this, never held whole."""
SEND_PIECE = 64 * 1024
"""Bytes per send of a response stream (see _GuardedStream)."""
STREAM_BURST = 4 * 1024 * 1024
"""How far ahead of ``--stream-min-rate`` a response stream's client may get (Pace.burst_bytes):
twice what the kernel may take before it wakes a writer again (half a default 4 MiB send
buffer), so a client reading steadily at the rate is never cut between two of those steps."""
BODY_BURST = 1024 * 1024
"""How far ahead of ``--body-min-rate`` a request body may get: bodies arrive as the socket
reads them (256 KiB at most), not in the kernel's steps."""
UPLOAD_THREADS = 32
"""Threads for uploads (each holds one for its whole length)."""
UPLOAD_HEADROOM = 8
"""Upload threads the cap on uploads (``uploads_max``) always leaves free: a thread may still
be finishing the call of an upload whose client has gone (the call's cancel reaching it), so
an upload let in never waits for a thread. One that waited kept up to 2 MiB of its body and
its connection, with no bound on how many."""
UPLOAD_QUEUE = 8
"""Chunks in flight between the HTTP body and the upload's gRPC stream (2 MiB at most)."""
MAX_JSON_BODY = 8 * 1024 * 1024
_UPLOAD_METHOD = "engram.artifacts.v1.ArtifactsService.CreateArtifact"
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # not in grpc-stubs
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


MIN_RATE = 1.0
"""The least a minimum rate may be, bytes a second, when it is not 0 (off): a rate of 1e-320
made every byte worth more waiting than a float holds, which switched the guard off."""


def rate_problem(bytes_per_s: float) -> str:
    """What is wrong with a minimum rate (``--body-min-rate``, ``--stream-min-rate``), or ''."""
    if bytes_per_s == 0 or (math.isfinite(bytes_per_s) and bytes_per_s >= MIN_RATE):
        return ""
    return (f"must be 0 (off) or a finite number of bytes a second of at least {MIN_RATE:g}, "
            f"got {bytes_per_s}")


DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""The services' default ``ENGRAM_LIMITS_GRPC_RECEIVE_BYTES``."""


def _services_receive_limit() -> int:
    value = os.environ.get("ENGRAM_LIMITS_GRPC_RECEIVE_BYTES", "")
    if not value:
        return DEFAULT_MAX_REQUEST_BYTES
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"ENGRAM_LIMITS_GRPC_RECEIVE_BYTES must be a whole number of bytes, "
                         f"got {value!r}") from None


@dataclass(frozen=True)
class GatewayConfig:
    """Where each service listens, how to reach it (TLS files) and the unary deadline."""

    addresses: Mapping[str, str]
    tls_ca: bytes | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    timeout_seconds: float = 30.0
    body_idle_seconds: float = 30.0
    """A request body (an upload, a JSON body) that sends nothing for this long is answered
    408 and its call ended: a client trickling bytes cannot hold an upload thread for good."""
    body_min_bytes_per_s: float = 16 * 1024
    """After its first ``body_idle_seconds``, a body must keep up this average rate (Apache's
    mod_reqtimeout MinRate): one byte just inside every idle limit held an upload thread for
    as long as the client liked. Bytes sent more than ``BODY_BURST`` ahead of the rate earn
    nothing (a fast start banked hours of trickling). 0 turns the rate off (the idle limit
    stays)."""
    uploads_per_token: int = UPLOAD_THREADS // 4
    """Uploads one token may have running at once; one more is 429 RESOURCE_EXHAUSTED
    (UPLOAD_LIMIT): one token cannot take every upload thread."""
    uploads_max: int = UPLOAD_THREADS - UPLOAD_HEADROOM
    """Uploads the gateway runs at once, whoever sends them, at most ``UPLOAD_THREADS -
    UPLOAD_HEADROOM``; one more is 503 UNAVAILABLE (UPLOADS_BUSY) at once. Without it, uploads
    past the threads queued with no bound on how many, each holding its connection and up to
    2 MiB of body."""
    stream_idle_seconds: float = 30.0
    """A response stream (a download, a snapshot) whose service sends nothing for this long,
    or whose client takes nothing for this long and then less than ``stream_min_bytes_per_s``
    on average over the time the gateway waited on it, is ended and its gRPC call cancelled:
    a client that stops reading cannot hold one of the service's stream slots for good (unless
    the rate is 0)."""
    stream_min_bytes_per_s: float = 16 * 1024
    """The average rate a response stream's client must take once its first
    ``stream_idle_seconds`` of waiting have passed (an average, because the kernel reports a
    slow reader's progress in steps of up to half its send buffer, megabytes). Bytes taken
    more than ``STREAM_BURST`` ahead of the rate earn nothing: a client that read fast at
    first and then stopped is cut after at most ``stream_idle_seconds + STREAM_BURST /
    stream_min_bytes_per_s`` of waiting (4.8 min by default), not hours later. 0 turns the
    guard on the client off: no rate, and no limit per send either (one would cut a steady
    slow reader, for the same kernel steps); the limit on a silent service stays."""
    upload_answer_seconds: float = 300.0
    """How long an upload waits on the artifacts service, to take the next part of the body
    or, once it has the whole body, to answer; then its call is cancelled and it is 504
    DEADLINE_EXCEEDED (UPLOAD_ANSWER_TIMEOUT). A service that stalled (stuck storage, a hung
    S3 put) held the upload's thread and place for good, until every upload was 503
    UPLOADS_BUSY. 300 s by default: the service spools the whole body and only then puts it to
    its store, S3 in one PutObject up to 1 GiB, so a large blob's answer comes minutes after
    its last byte (1 GiB at 3.5 MB/s is 300 s)."""
    body_bytes_max: int = 4 * MAX_JSON_BODY
    """Bytes of JSON request bodies the gateway holds at once, being received or parsed (at
    least ``MAX_JSON_BODY``); a body that would pass it is 503 UNAVAILABLE (BODIES_BUSY) with
    Retry-After, nothing stored. Without it any number of 8 MiB bodies were read and parsed at
    once (found by review on 2026-11-29)."""
    body_bytes_per_token: int = 2 * MAX_JSON_BODY
    """Of those, what one token holds at once (at least ``MAX_JSON_BODY``, at most
    ``body_bytes_max``); past it 429 RESOURCE_EXHAUSTED (BODY_LIMIT) with Retry-After. With
    ``token_keys``, what one agent holds (its tokens verified here), and every token that does
    not verify shares one such budget."""
    body_bytes_unverified: int = MAX_JSON_BODY
    """Of those, what every token the gateway cannot verify holds together (at most
    ``body_bytes_per_token``): with one token's share it leaves room for others."""
    token_keys: tuple[Path, ...] = ()
    """Public keys (files or directories, as the services' ``ENGRAM_AUTH_PUBLIC_KEY(S)``) the
    gateway verifies bearer tokens with, only to know whose a body is: made-up tokens would
    otherwise each get a budget of their own and fill the total (found by review on
    2026-11-29). The services still authorize every call. Empty: each Authorization value
    is its own holder. A token signed by a key the gateway has not loaded makes it read the
    sources again, at most every ``KEY_RELOAD_SECONDS`` (a key rotation: restart it with the
    services or let it find the new key)."""
    token_home: Path | None = None
    """Set when ``token_keys`` are ``$ENGRAM_HOME``'s key pair: a reload works them out again
    (the retired-keys directory appears with the first rotation)."""
    token_leeway_seconds: float = 30.0
    """Clock skew tolerated on a token's times, as the services' ``ENGRAM_AUTH_LEEWAY_SECONDS``
    (read from the same variable)."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """The largest request message the services accept (their
    ``ENGRAM_LIMITS_GRPC_RECEIVE_BYTES``, read from the same variable here): a JSON body that
    makes a larger message is 400 BODY_TOO_LARGE before any call. Sent on, gRPC refused it
    RESOURCE_EXHAUSTED, which reached HTTP clients as 429, a signal to retry a call that can
    never succeed."""
    title: str = "Engram HTTP/JSON gateway"
    extra_metadata: Sequence[tuple[str, str]] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("body_idle_seconds", "stream_idle_seconds", "upload_answer_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        for name in ("body_min_bytes_per_s", "stream_min_bytes_per_s"):
            problem = rate_problem(getattr(self, name))
            if problem:
                raise ValueError(f"{name} {problem}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be at least 1, got "
                             f"{self.max_request_bytes}")
        if not MAX_JSON_BODY <= self.body_bytes_per_token <= self.body_bytes_max:
            raise ValueError(f"body_bytes_per_token must be {MAX_JSON_BODY}..body_bytes_max "
                             f"({self.body_bytes_max}), got {self.body_bytes_per_token}")
        if not MAX_JSON_BODY <= self.body_bytes_unverified <= self.body_bytes_per_token:
            raise ValueError(f"body_bytes_unverified must be {MAX_JSON_BODY}.."
                             f"body_bytes_per_token ({self.body_bytes_per_token}), got "
                             f"{self.body_bytes_unverified}")
        if self.uploads_per_token < 1:
            raise ValueError(f"uploads_per_token must be at least 1, got "
                             f"{self.uploads_per_token}")
        if not 1 <= self.uploads_max <= UPLOAD_THREADS - UPLOAD_HEADROOM:
            raise ValueError(f"uploads_max must be 1..{UPLOAD_THREADS - UPLOAD_HEADROOM} (the "
                             f"gateway keeps {UPLOAD_HEADROOM} of its {UPLOAD_THREADS} upload "
                             f"threads free), got {self.uploads_max}")

    @classmethod
    def from_settings(cls, settings: ClientSettings, **overrides: Any) -> GatewayConfig:
        def read(path: Any) -> bytes | None:
            return path.read_bytes() if path is not None else None

        if (settings.tls_cert is None) != (settings.tls_key is None):
            raise ValueError("a client certificate needs its key: set both ENGRAM_TLS_CERT and "
                             "ENGRAM_TLS_KEY")
        keys = TokenKeySettings(home=settings.home)  # as the services read them
        return cls(
            addresses={"shard": settings.shard_addr, "governance": settings.governance_addr,
                       "artifacts": settings.artifacts_addr,
                       "compactor": settings.compactor_addr},
            tls_ca=read(settings.tls_ca), tls_cert=read(settings.tls_cert),
            tls_key=read(settings.tls_key), timeout_seconds=settings.timeout_seconds,
            body_idle_seconds=settings.timeout_seconds,
            stream_idle_seconds=settings.timeout_seconds,
            max_request_bytes=_services_receive_limit(),
            token_keys=token_key_sources(keys), token_leeway_seconds=keys.auth_leeway_seconds,
            token_home=None if keys.names_public_keys else settings.home, **overrides)

    def open_blocking_channel(self, backend: str) -> grpc.Channel:
        target = self.addresses[backend]
        if self.tls_ca is None:
            return grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        credentials = grpc.ssl_channel_credentials(self.tls_ca, self.tls_key, self.tls_cert)
        return grpc.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)

    def open_channel(self, backend: str) -> grpc.aio.Channel:
        target = self.addresses[backend]
        if self.tls_ca is None:
            return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        credentials = grpc.ssl_channel_credentials(self.tls_ca, self.tls_key, self.tls_cert)
        return grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)


def error_response(status: Any, headers: Mapping[str, str] | None = None,
                   http: int | None = None) -> JSONResponse:
    return JSONResponse(status_json(status), status_code=http or http_status(status),
                        headers=dict(headers or {}))


def _grpc_error(error: grpc.aio.AioRpcError, route: Route) -> JSONResponse:
    return error_response(status_from_rpc_error(error, route.backend))


def _transcoded(route: Route, params: Mapping[str, str], query: Sequence[tuple[str, str]],
                raw: bytes | None) -> Message:
    try:
        return build_request(route, params, query,
                             parse_body(raw) if raw is not None else None)
    except RecursionError:  # "[[[[..." thousands deep, in the JSON or in the message
        raise TranscodeError("the body nests too deeply to be a request",
                             reason="INVALID_JSON") from None


def _refused_authorization(request: Request) -> JSONResponse | None:
    """401 before the body is read when the call cannot be authenticated: every route reaches
    an RPC that needs a token, so a caller without one gets nothing parsed for it (before, an
    anonymous 8 MiB body was read and parsed first, a CPU-second each). A header gRPC metadata
    cannot carry (non-ASCII, control characters) or longer than any token is the caller's
    mistake: 401 here, not a 500 from the channel or a 429 for its size."""
    value = request.headers.get("authorization") or ""
    problem = malformed_authorization(value)
    if problem is not None:
        return error_response(status_of(grpc.StatusCode.UNAUTHENTICATED, problem,
                                        "TOKEN_MALFORMED"))
    if not bearer_of(value):
        return error_response(status_of(
            grpc.StatusCode.UNAUTHENTICATED, "missing bearer token: send 'Authorization: "
            "Bearer <token>' (see `engram token create`)", "TOKEN_MISSING"))
    return None


def _metadata(request: Request) -> tuple[tuple[str, str], ...]:
    authorization = request.headers.get("authorization")
    return (("authorization", authorization),) if authorization else ()


class Gateway:
    """Matches a request to a route, transcodes it, calls the service, transcodes back."""

    def __init__(self, config: GatewayConfig, routes: Sequence[Route] | None = None) -> None:
        self.config = config
        self.routes = list(routes if routes is not None else load_routes())
        self.openapi = build_openapi(self.routes, title=config.title)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._callables: dict[tuple[str, str], Any] = {}
        self._blocking_channels: list[grpc.Channel] = []
        # Uploads block a thread each for their whole length: their own pool, not asyncio's.
        self._upload_threads = ThreadPoolExecutor(max_workers=UPLOAD_THREADS,
                                                  thread_name_prefix="engram-gateway-upload")
        self._uploads: dict[bytes, int] = {}
        """Uploads running, by their holder (token_holder; event loop only)."""
        self._uploads_running = 0
        """Uploads running, whoever sent them (event loop only)."""
        self._bodies = BodyBudget(config.body_bytes_max, config.body_bytes_per_token,
                                  config.body_bytes_unverified)
        self._holders = BodyHolders(config.token_keys, config.token_home,
                                    config.token_leeway_seconds)
        if not self._holders.verifies:
            log.warning("no token public keys (ENGRAM_AUTH_PUBLIC_KEY(S), or $ENGRAM_HOME's key "
                        "pair): request bodies are budgeted by Authorization value, so made-up "
                        "tokens each get a budget of their own (docs/gateway.md)")

    def channel(self, backend: str) -> grpc.aio.Channel:
        # Opened on first use, inside the server's event loop (grpc.aio binds to it).
        if backend not in self._channels:
            self._channels[backend] = self.config.open_channel(backend)
        return self._channels[backend]

    def callable(self, route: Route, kind: str) -> Any:
        """The channel's multicallable for a route (``unary_unary``, ``unary_stream``,
        ``stream_unary``), made once."""
        key = (route.grpc_path, kind)
        if key not in self._callables:
            self._callables[key] = getattr(self.channel(route.backend), kind)(
                route.grpc_path, request_serializer=_serialize,
                response_deserializer=route.response_class.FromString)
        return self._callables[key]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
        self._callables.clear()
        for blocking in self._blocking_channels:
            blocking.close()
        self._blocking_channels.clear()
        self._upload_threads.shutdown(wait=False, cancel_futures=True)

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            try:
                yield
            finally:
                await self.close()

        async def openapi(_request: Request) -> Response:
            return JSONResponse(self.openapi)

        async def healthz(_request: Request) -> Response:
            return JSONResponse({"status": "SERVING"})

        async def transcode(scope: Scope, receive: Receive, send: Send) -> None:
            response = await self.dispatch(Request(scope, receive))
            await response(scope, receive, send)

        app = Starlette(routes=[
            StarletteRoute("/openapi.json", openapi, methods=["GET"]),
            StarletteRoute("/healthz", healthz, methods=["GET"]),
        ], lifespan=lifespan)
        # Every other path is matched against the annotations' templates, not by Starlette's
        # router (whose patterns stop at a newline and speak text/plain).
        app.router.default = transcode
        return app

    async def dispatch(self, request: Request) -> Response:
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        path = raw_path.decode("latin-1").split("?", 1)[0]
        allowed: list[str] = []
        for route in self.routes:
            params = route.path.match(path)
            if params is None:
                continue
            if route.http_method != request.method:
                allowed.append(route.http_method)
                continue
            decoded = {name: unquote(value) for name, value in params.items()}
            try:
                return await self.handle(route, decoded, request)
            except TranscodeError as error:
                return error_response(status_of(grpc.StatusCode.INVALID_ARGUMENT, str(error),
                                                error.reason))
            except ClientDisconnect:
                return Response(status_code=499)
            except BodyIdle as error:
                return error_response(status_of(grpc.StatusCode.DEADLINE_EXCEEDED, str(error),
                                                error.reason), http=408)
        if allowed:
            return error_response(
                status_of(grpc.StatusCode.UNIMPLEMENTED, f"{request.method} is not served on "
                          f"{path}; use {', '.join(sorted(set(allowed)))}", "METHOD_NOT_ALLOWED"),
                headers={"allow": ", ".join(sorted(set(allowed)))}, http=405)
        return error_response(status_of(grpc.StatusCode.NOT_FOUND, f"no route for {path}",
                                        "ROUTE_NOT_FOUND"))

    async def handle(self, route: Route, params: dict[str, str], request: Request) -> Response:
        refused = _refused_authorization(request)
        if refused is not None:
            return refused
        if route.client_streaming:
            if route.method.full_name != _UPLOAD_METHOD:
                return error_response(status_of(
                    grpc.StatusCode.UNIMPLEMENTED, f"{route.method.full_name} is "
                    "client-streaming and has no HTTP form here", "STREAM_NOT_SUPPORTED"))
            return await self.upload(route, params, request)
        lease = self._bodies.lease(self._body_holder(request.headers.get("authorization", "")))
        try:
            raw = (await _read_limited(request, self._body_pace(), lease) if route.body
                   else None)
            query = request.query_params.multi_items() if route.body != "*" else []
            # Parsing megabytes of JSON takes a CPU-second: off the event loop, which serves
            # every other request (and /healthz) meanwhile.
            message = await asyncio.to_thread(_transcoded, route, params, query, raw)
        except BodyRefused as busy:
            return error_response(busy.status, headers={"retry-after": "1"})
        finally:
            lease.release()
        size = message.ByteSize()
        if size > self.config.max_request_bytes:
            return error_response(status_of(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request makes a {size}-byte message, "
                f"over the {self.config.max_request_bytes} bytes the services accept "
                "(ENGRAM_LIMITS_GRPC_RECEIVE_BYTES): send less per call, e.g. fewer records "
                "per records:batchCreate", "BODY_TOO_LARGE"))
        if route.server_streaming:
            return await self.server_stream(route, message, request)
        call = self.callable(route, "unary_unary")
        try:
            response = await call(message, metadata=_metadata(request),
                                  timeout=self.config.timeout_seconds)
        except grpc.aio.AioRpcError as error:
            return _grpc_error(error, route)
        # Off the event loop, as the request's parsing: a page of 1,000 records of control
        # characters is 43 MB of protobuf and 257 MB of JSON, 0.76 s of CPU that blocked every
        # other request and /healthz (found in review, 2026-11-30).
        return await asyncio.to_thread(_json_response, response)

    def _body_holder(self, authorization: str) -> bytes:
        return self._holders.holder(authorization)

    def _body_pace(self) -> Pace:
        return Pace(self.config.body_idle_seconds, self.config.body_min_bytes_per_s,
                    BODY_BURST)

    async def server_stream(self, route: Route, message: Message,
                            request: Request) -> Response:
        call = self.callable(route, "unary_stream")(message, metadata=_metadata(request))
        pace = Pace(self.config.stream_idle_seconds, self.config.stream_min_bytes_per_s)
        idle = pace.idle_seconds
        try:
            first = await _read(call, idle, route)
        except grpc.aio.AioRpcError as error:
            return _grpc_error(error, route)
        except StreamIdle as error:
            call.cancel()
            return error_response(status_of(grpc.StatusCode.DEADLINE_EXCEEDED, str(error),
                                            "STREAM_IDLE_TIMEOUT"), http=504)
        if "chunk" in route.response_class.DESCRIPTOR.fields_by_name:
            return _download(call, first, route, pace)
        return _GuardedStream(_ndjson(call, first, route, idle), pace, call,
                              media_type=NDJSON)

    async def upload(self, route: Route, params: dict[str, str], request: Request) -> Response:
        """``POST /v1/runs/{run_id}/artifacts?step_id=..&name=..``: the body is the bytes."""
        holder = token_holder(request.headers.get("authorization", ""))
        running = self._uploads.get(holder, 0)
        if running >= self.config.uploads_per_token:
            return error_response(status_of(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"this token has {running} uploads running, "
                f"the most one token may have at once; retry when one ends", "UPLOAD_LIMIT"),
                headers={"retry-after": "1"})
        if self._uploads_running >= self.config.uploads_max:
            return error_response(status_of(
                grpc.StatusCode.UNAVAILABLE, f"the gateway is running {self._uploads_running} "
                "uploads, the most it takes at once; retry in a moment", "UPLOADS_BUSY",
                {"uploads_max": str(self.config.uploads_max)}),
                headers={"retry-after": "1"})
        self._uploads[holder] = running + 1
        self._uploads_running += 1
        try:
            return await self._upload(route, params, request)
        finally:
            self._uploads_running -= 1
            if self._uploads[holder] <= 1:
                del self._uploads[holder]
            else:
                self._uploads[holder] -= 1

    async def _upload(self, route: Route, params: dict[str, str],
                      request: Request) -> Response:
        query = list(request.query_params.multi_items())
        names = {name.removeprefix("header.") for name, _ in query}
        if "mime_type" not in names and request.headers.get("content-type"):
            query.append(("mime_type", request.headers["content-type"]))
        if "expected_hash" not in names and request.headers.get("x-engram-sha256"):
            query.append(("expected_hash", request.headers["x-engram-sha256"]))
        first = build_request(route, params, query, None, query_prefix="header.")
        assert isinstance(first, artifacts_pb.CreateArtifactRequest)

        async def parts() -> AsyncIterator[artifacts_pb.CreateArtifactRequest]:
            yield first
            size, digest = 0, hashlib.sha256()
            async for piece in _body(request, self._body_pace()):
                for start in range(0, len(piece), UPLOAD_CHUNK):
                    chunk = piece[start:start + UPLOAD_CHUNK]
                    size += len(chunk)
                    digest.update(chunk)
                    yield artifacts_pb.CreateArtifactRequest(chunk=chunk)
            yield artifacts_pb.CreateArtifactRequest(trailer=artifacts_pb.ArtifactTrailer(
                size_bytes=size, sha256=digest.hexdigest()))

        # grpc.aio replaces the service's status with INTERNAL when the service answers while
        # the client is still writing (a refused header, bytes still coming), so uploads run
        # on a blocking channel (an upload thread waits for the answer), fed through a small
        # bounded queue.
        feed: queue.Queue[artifacts_pb.CreateArtifactRequest | None] = queue.Queue(UPLOAD_QUEUE)
        loop = asyncio.get_running_loop()
        taken = asyncio.Event()
        """Set each time the service's side takes a part off the feed (from gRPC's thread)."""

        def requests() -> Iterator[artifacts_pb.CreateArtifactRequest]:
            while True:
                part = feed.get()
                _wake(loop, taken)
                if part is None:
                    return
                yield part

        # The future form, so that the event loop can cancel a call whose service stalls.
        call = self.blocking_callable(route).future(requests(), metadata=_metadata(request))
        finished = loop.run_in_executor(self._upload_threads, _answer, call)
        limit = self.config.upload_answer_seconds
        body = parts().__aiter__()
        coming: asyncio.Future[artifacts_pb.CreateArtifactRequest] | None = None
        try:
            while True:
                # The next piece, or the service's answer if it comes first (a refused token
                # or header): a client that then sends nothing must not keep the upload
                # waiting on its body for the idle limit.
                coming = asyncio.ensure_future(body.__anext__())
                await asyncio.wait((coming, finished), return_when=asyncio.FIRST_COMPLETED)
                if not coming.done():
                    break  # the service has answered: the rest of the body is not needed
                try:
                    part = coming.result()
                except StopAsyncIteration:
                    break
                if not await _hand_over(feed, part, taken, finished, limit):
                    break  # the service has answered: the rest of the body is not needed
            await _hand_over(feed, None, taken, finished, limit)
            while not finished.done():  # the service has the whole body: its answer
                taken.clear()
                await _service_moves(taken, finished, limit)
        except _ServiceStalled:
            pass  # its call is cancelled below, and answered 504
        finally:
            if coming is not None and not coming.done():
                coming.cancel()
            if not finished.done():
                # A stalled service, or a client gone: the call ends now, nothing stored, and
                # its upload thread is free at once, not once the service moves again.
                call.cancel()
            _drain_and_end(feed)
        outcome = await finished
        if outcome is None:  # cancelled above: the service stalled
            return error_response(status_of(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"the {route.backend} service neither took "
                f"the upload's next part nor answered within {limit:g} s, the most the gateway "
                "waits on it (--upload-answer-timeout); the call was cancelled. Retry later; "
                "the service may have stored the artifact just before the cancel reached it, "
                "so list the run's artifacts first if a duplicate matters",
                "UPLOAD_ANSWER_TIMEOUT",
                {"service": route.backend, "timeout_seconds": f"{limit:g}"}))
        if isinstance(outcome, grpc.RpcError):
            return error_response(status_from_rpc_error(outcome, route.backend))
        return JSONResponse(to_json(outcome), status_code=200)

    def blocking_callable(self, route: Route) -> Any:
        key = (route.grpc_path, "blocking")
        if key not in self._callables:
            channel = self.config.open_blocking_channel(route.backend)
            self._blocking_channels.append(channel)
            self._callables[key] = channel.stream_unary(
                route.grpc_path, request_serializer=_serialize,
                response_deserializer=route.response_class.FromString)
        return self._callables[key]


def _answer(call: Any) -> Message | grpc.RpcError | None:
    """The service's answer to an upload's call (waited for in an upload thread), its error,
    or None when the gateway cancelled the call."""
    try:
        response: Message = call.result()
    except grpc.FutureCancelledError:
        return None
    except grpc.RpcError as error:
        return error
    return response


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set ``event`` from another thread (gRPC's, taking an upload's parts)."""
    with suppress(RuntimeError):  # the loop has closed (the gateway stopped)
        loop.call_soon_threadsafe(event.set)


class _ServiceStalled(Exception):
    """The service took no part of an upload and gave no answer for
    ``upload_answer_seconds``."""


async def _hand_over(feed: queue.Queue[Any], part: Any, taken: asyncio.Event,
                     finished: asyncio.Future[Any], limit: float) -> bool:
    """Put ``part`` on the feed once it has room; False if the service answered first.
    Woken by the service taking a part, not by polling the queue."""
    while not finished.done():
        taken.clear()  # before trying: a part taken from here on wakes the wait below
        try:
            feed.put_nowait(part)
            return True
        except queue.Full:
            pass
        await _service_moves(taken, finished, limit)
    return False


async def _service_moves(taken: asyncio.Event, finished: asyncio.Future[Any],
                         limit: float) -> None:
    """Until the service takes a part or answers; :class:`_ServiceStalled` if it does
    neither within ``limit`` seconds."""
    woken = asyncio.ensure_future(taken.wait())
    try:
        done, _ = await asyncio.wait((woken, finished), timeout=limit,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()
    if not done:
        raise _ServiceStalled


def _drain_and_end(feed: queue.Queue[Any]) -> None:
    """Unblock the request iterator whatever happened (it may wait on an empty queue)."""
    while True:
        try:
            feed.get_nowait()
        except queue.Empty:
            break
    feed.put_nowait(None)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class BodyIdle(Exception):
    """The client's body stalled (408): nothing for ``body_idle_seconds``
    (``BODY_IDLE_TIMEOUT``) or slower than ``body_min_bytes_per_s`` (``BODY_TOO_SLOW``)."""

    def __init__(self, message: str, reason: str = "BODY_IDLE_TIMEOUT") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Pace:
    """How a client must keep up with a request body it sends or a response stream it reads.

    The client holds credit: the seconds of waiting on it the gateway still allows. It starts
    at ``idle_seconds``; each second the gateway waits on the client spends one, each
    ``min_bytes_per_s`` bytes the client moves earn one back, and the credit never rises above
    ``idle_seconds + burst_bytes / min_bytes_per_s`` (:attr:`most_credit`): a client that went
    fast at first cannot bank hours of stalling for later. Credit spent is the rate not kept.
    Only waiting counts: while the gateway itself is busy (every upload thread taken, a slow
    service) the client is not held to the rate. A body also sends a piece at least every
    ``idle_seconds``, whatever its credit."""

    idle_seconds: float
    min_bytes_per_s: float = 0.0
    """0: no rate."""
    burst_bytes: int = STREAM_BURST
    """How far ahead of the rate a client may get: what it moved beyond that earns nothing."""

    @property
    def rated(self) -> bool:
        return self.min_bytes_per_s > 0

    @property
    def most_credit(self) -> float:
        """The most waiting a client can have in hand: after any start, a client that stops
        is cut within this many seconds of waiting."""
        return self.idle_seconds + self.burst_bytes / self.min_bytes_per_s

    def earn(self, credit: float, waited: float, transferred: int) -> float:
        """The credit left after the gateway waited ``waited`` seconds for ``transferred``
        bytes; below 0, the client fell behind the rate."""
        return min(credit - waited + transferred / self.min_bytes_per_s, self.most_credit)


_MIN_PIECE_WAIT = 0.05
"""A piece already received (buffered while the gateway was busy) is taken even when the
allowance is spent: a zero timeout would refuse it unread."""


async def _body(request: Request, pace: Pace) -> AsyncIterator[bytes]:
    """The request body's pieces; :class:`BodyIdle` when the body stalls (see Pace)."""
    pieces = request.stream().__aiter__()
    credit = pace.idle_seconds
    waited, received = 0.0, 0
    while True:
        by_rate = pace.rated and credit < pace.idle_seconds
        wait = credit if by_rate else pace.idle_seconds
        began = time.monotonic()
        try:
            piece = await asyncio.wait_for(pieces.__anext__(), max(wait, _MIN_PIECE_WAIT))
        except StopAsyncIteration:
            return
        except TimeoutError:
            waited += time.monotonic() - began
            if by_rate:
                raise _too_slow(pace, received, waited) from None
            raise BodyIdle(f"the request body sent nothing for {pace.idle_seconds:g} s; "
                           "nothing was stored") from None
        spent = time.monotonic() - began
        waited += spent
        received += len(piece)
        # The floor above takes a piece even past the credit: a client trickling within the
        # floor would otherwise never be judged.
        if pace.rated:
            credit = pace.earn(credit, spent, len(piece))
            if credit < 0:
                raise _too_slow(pace, received, waited)
        yield piece


def _too_slow(pace: Pace, received: int, waited: float) -> BodyIdle:
    return BodyIdle(f"the request body came slower than {pace.min_bytes_per_s:g} bytes/s "
                    f"({received} bytes in {waited:.1f} s of waiting for them, of which at "
                    f"most {pace.burst_bytes} bytes ahead of the rate count); nothing was "
                    "stored", "BODY_TOO_SLOW")


async def _read_limited(request: Request, pace: Pace, lease: BodyLease) -> bytes:
    received = bytearray()
    async for piece in _body(request, pace):
        # the size first: a body that can never be taken is 400, not a 429/503 to retry
        if len(received) + len(piece) > MAX_JSON_BODY:
            raise TranscodeError(f"a JSON body may be at most {MAX_JSON_BODY} bytes; "
                                 "upload blobs as artifacts", reason="BODY_TOO_LARGE")
        lease.take(len(piece))
        received += piece
    return bytes(received)


class StreamIdle(Exception):
    """The service sent nothing on a response stream for ``stream_idle_seconds``."""


async def _read(call: Any, idle_seconds: float, route: Route) -> Any:
    """The stream's next message; :class:`StreamIdle` if none comes for ``idle_seconds``."""
    try:
        return await asyncio.wait_for(call.read(), idle_seconds)
    except TimeoutError:
        raise StreamIdle(f"{route.backend} sent nothing on {route.method.full_name} for "
                         f"{idle_seconds:g} s; the stream was ended") from None


class _GuardedStream(StreamingResponse):
    """A streaming response that ends, and cancels its gRPC call, when its client falls behind
    its :class:`Pace` (it stopped reading). The connection is then closed short of the body,
    so the client cannot take what it got for the whole."""

    def __init__(self, content: AsyncIterator[bytes], pace: Pace, call: Any,
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._pace = pace
        self._call = call
        self._credit = pace.idle_seconds
        self._waited = 0.0
        self._sent = 0

    async def stream_response(self, send: Send) -> None:
        async def guarded(message: Any) -> None:
            # No idle limit per send here, only the credit: a send can wait seconds on a
            # client that reads all along (see stream_min_bytes_per_s). Without a rate, no
            # limit on the client at all.
            limit = max(self._credit, _MIN_PIECE_WAIT) if self._pace.rated else None
            began = time.monotonic()
            try:
                await asyncio.wait_for(send(message), limit)
            except TimeoutError:
                raise _ClientStalled from None
            finally:
                spent = time.monotonic() - began
                self._waited += spent
            moved = len(message.get("body", b""))
            self._sent += moved
            if self._pace.rated:
                self._credit = self._pace.earn(self._credit, spent, moved)

        async def sent_in_pieces() -> None:
            # A send waits for the one before it to drain: in pieces of SEND_PIECE the limit
            # judges a client that stopped reading, not one that reads a 1 MiB chunk slowly
            # (a client taking 64 KiB per ENGRAM_TIMEOUT_SECONDS is never cut).
            await guarded({"type": "http.response.start", "status": self.status_code,
                           "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                data = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(
                    self.charset)
                view = memoryview(data)
                for start in range(0, len(view), SEND_PIECE):
                    await guarded({"type": "http.response.body",
                                   "body": bytes(view[start:start + SEND_PIECE]),
                                   "more_body": True})
            await guarded({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await sent_in_pieces()
        except _ClientStalled:
            log.warning("a client fell behind a response stream (%d bytes taken in %.1f s of "
                        "waiting on it); the stream was ended and its call cancelled",
                        self._sent, self._waited)
        except StreamIdle as error:  # a download's headers are sent: only a cut body says it
            log.warning("%s", error)
        finally:
            self._call.cancel()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


class _ClientStalled(Exception):
    pass


async def _ndjson(call: Any, first: Any, route: Route,
                  idle_seconds: float) -> AsyncIterator[bytes]:
    """One response message per line; a failure after the first line is a last line
    ``{"error": Status}`` (the HTTP status has already been sent)."""
    try:
        message = first
        while message is not EOF:
            yield json.dumps(to_json(message), separators=(",", ":")).encode() + b"\n"
            message = await _read(call, idle_seconds, route)
    except grpc.aio.AioRpcError as error:
        yield json.dumps({"error": status_json(status_from_rpc_error(error))}).encode() + b"\n"
    except StreamIdle as error:
        yield json.dumps({"error": status_json(status_of(
            grpc.StatusCode.DEADLINE_EXCEEDED, str(error), "STREAM_IDLE_TIMEOUT"))}).encode() \
            + b"\n"
    finally:
        call.cancel()


def _download(call: Any, first: Any, route: Route, pace: Pace) -> Response:
    """The first message's metadata as headers, then the bytes as they come. A failure after
    the headers (DATA_LOSS on a hash mismatch) cuts the connection short of Content-Length,
    so no client takes a truncated body for the artifact."""
    headers: dict[str, str] = {}
    media_type = "application/octet-stream"
    if first is not EOF and first.WhichOneof("part") != "chunk":
        meta = getattr(first, first.WhichOneof("part") or "", None)
        if meta is not None:
            document = to_json(meta)
            headers["x-engram-artifact"] = json.dumps(document, separators=(",", ":"))
            stored = document.get("mimeType") or ""
            if MIME_TYPE.fullmatch(stored):  # one stored before the check is served as bytes
                media_type = stored
            if document.get("sizeBytes") is not None:
                headers["content-length"] = str(document["sizeBytes"])
            if document.get("hash"):
                headers["etag"] = f'"{document["hash"]}"'
                headers["x-engram-sha256"] = document["hash"]
            if document.get("artifactId"):
                headers["x-engram-artifact-id"] = document["artifactId"]

    async def body() -> AsyncIterator[bytes]:
        try:
            message = first
            while message is not EOF:
                if message.WhichOneof("part") == "chunk":
                    yield message.chunk
                message = await _read(call, pace.idle_seconds, route)
        finally:
            call.cancel()

    # Served as a download, never rendered by a browser as the gateway's own page.
    headers["x-content-type-options"] = "nosniff"
    headers["content-disposition"] = "attachment"
    return _GuardedStream(body(), pace, call, media_type=media_type, headers=headers)


def _json_response(message: Message) -> JSONResponse:
    """The answer's JSON, rendered (a JSONResponse renders its body when it is made)."""
    return JSONResponse(to_json(message))
