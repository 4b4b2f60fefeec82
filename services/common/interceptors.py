"""Server interceptors: metrics, logging, errors, concurrency, auth, rate, records, streams, text,
outermost first.

Each wraps the method handler's behaviour function, so one helper
(:func:`_wrap_handler`) serves the four RPC shapes. Streaming responses are
wrapped as generators so the principal and error mapping cover the whole
stream, not just its creation.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common.admission import (
    ConcurrencyLimit,
    MethodKinds,
    RateLimiter,
    RecordCounts,
    RecordRate,
    StreamsPerAgent,
)
from services.common.auth import (
    Authorizer,
    bind_principal,
    call_metadata,
    current_principal,
    is_service,
    unbind_principal,
)
from services.common.errors import ERROR_DOMAIN, DeadlineExceeded, EngramError, InvalidArgument
from services.common.metrics import GrpcMetrics, Tally
from services.common.storage_errors import storage_error

log = logging.getLogger("engram.rpc")

Behavior = Callable[[Any, grpc.ServicerContext], Any]
Wrapper = Callable[[Behavior, str, bool], Behavior]


def _wrap_handler(handler: grpc.RpcMethodHandler[Any, Any], wrap: Wrapper, method: str,
                  deserializer: Callable[[Any], Any] = lambda parse: parse) -> Any:
    kind: Any
    factory: Any
    if handler.request_streaming and handler.response_streaming:
        kind, factory = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        kind, factory = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        kind, factory = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        kind, factory = handler.unary_unary, grpc.unary_unary_rpc_method_handler
    return factory(
        wrap(kind, method, bool(handler.response_streaming)),
        request_deserializer=deserializer(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


def status_code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    """The code set on the call so far (``ServicerContext.code()``, absent from the stubs)."""
    code: grpc.StatusCode | None = cast(Any, context).code()
    return code


if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
else:  # generic only in the type stubs
    _ServerInterceptor = grpc.ServerInterceptor


class _BehaviorInterceptor(_ServerInterceptor):
    """Wraps a method's handler once and reuses the wrapper: gRPC asks on every call, and a
    wrapper holds nothing of a call (rebuilding four per call cost ~6% of a write's CPU)."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[Any, Any]] = {}  # method -> (handler, its wrapper)

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        raise NotImplementedError

    def deserializer(self, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        """The request parser this interceptor hands on (the same, unless it replaces it)."""
        return parse

    def wrap_handler(self, handler: grpc.RpcMethodHandler[Any, Any], method: str) -> Any:
        """The handler this interceptor hands on for ``method`` (built once, then cached)."""
        return _wrap_handler(handler, self.wrap, method, self.deserializer)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cache = self._wrapped
        hit = cache.get(method)
        if hit is not None and hit[0] is handler:
            return hit[1]  # type: ignore[no-any-return]
        wrapped = self.wrap_handler(handler, method)
        if len(cache) < 10_000:  # methods are few; unknown names never get here (None above)
            cache[method] = (handler, wrapped)
        return wrapped  # type: ignore[no-any-return]


def _status_for(error: EngramError) -> status_pb2.Status:
    info = error_details_pb2.ErrorInfo(
        reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    details = [detail]
    if error.retry_delay is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(max(0, round(error.retry_delay * 1e9)))
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    code = grpc.StatusCode[error.code]
    return status_pb2.Status(code=code.value[0], message=error.message, details=details)


class ErrorInterceptor(_BehaviorInterceptor):
    """Maps :class:`EngramError` to its status; anything else to INTERNAL with a reference.

    Every error it answers is counted in ``errors`` by code and reason (rate-limit and
    concurrency refusals, a full disk, an unavailable database: the reasons are a fixed set).
    """

    def __init__(self, errors: Tally | None = None) -> None:
        super().__init__()
        self.errors = errors or Tally()

    def _abort(self, context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
        if isinstance(exc, EngramError):
            self.errors.add(exc.code, exc.reason)
            context.abort_with_status(rpc_status.to_status(_status_for(exc)))
        storage = storage_error(exc)
        if storage is not None:  # a full or failing volume: the client can act on it
            log.warning("%s failed: %s (%s)", method, storage.message, storage.reason)
            self.errors.add(storage.code, storage.reason)
            context.abort_with_status(rpc_status.to_status(_status_for(storage)))
        self.errors.add("INTERNAL", "INTERNAL")
        ref = uuid.uuid4().hex[:12]
        log.exception("unhandled error in %s (ref %s)", method, ref, exc_info=exc)
        context.abort(grpc.StatusCode.INTERNAL, f"internal error; reference {ref} in server logs")

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    yield from behavior(request, context)
                except Exception as exc:
                    if _is_abort(exc, context):
                        raise
                    self._abort(context, exc, method)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return behavior(request, context)
            except Exception as exc:
                if _is_abort(exc, context):
                    raise
                self._abort(context, exc, method)

        return unary


def _is_abort(exc: Exception, context: grpc.ServicerContext) -> bool:
    # context.abort() raises a bare Exception after setting the code; let it through.
    return type(exc) is Exception and status_code(context) not in (None, grpc.StatusCode.OK)


STREAM_RECHECK_SECONDS = 1.0
"""How often a stream's caller is authorized again while the stream runs."""
UPLOAD_IDLE_SECONDS = 60.0
"""An upload (a client stream) that sends nothing for this long is ended, DEADLINE_EXCEEDED
UPLOAD_IDLE, and its place given back."""
_READ_AHEAD = 2
"""Messages of an upload read ahead of the service: flow control still holds the client."""


def _client_stream(requests: Iterator[Any], recheck: Callable[[], object]) -> Iterator[Any]:
    """An upload's messages, read by a thread of its own so that this one can wait for them
    with a timeout: the caller is authorized again each second also while the upload sends
    nothing (a revoked token or a suspended agent ends it within the bound, where before it
    held its place until the next message came), and an upload silent for
    ``UPLOAD_IDLE_SECONDS`` is ended (found by a review, 2026-11-29: stalled uploads held
    their call slots for good). The reader thread ends with the call."""
    inbox: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=_READ_AHEAD)
    done = threading.Event()

    def deliver(item: tuple[str, Any]) -> bool:
        while not done.is_set():
            try:
                inbox.put(item, timeout=STREAM_RECHECK_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for message in requests:
                if not deliver(("message", message)):
                    return
        except BaseException as error:  # the call ended under it (cancel, deadline)
            deliver(("error", error))
        else:
            deliver(("end", None))

    threading.Thread(target=read, name="upload-reader", daemon=True).start()
    checked = heard = time.monotonic()
    try:
        while True:
            try:
                kind, item = inbox.get(timeout=STREAM_RECHECK_SECONDS)
            except queue.Empty:
                kind, item = "", None
            now = time.monotonic()
            if now - checked >= STREAM_RECHECK_SECONDS:
                recheck()
                checked = now
            if kind == "message":
                heard = now
                yield item
            elif kind == "end":
                return
            elif kind == "error":
                raise item
            elif now - heard >= UPLOAD_IDLE_SECONDS:
                raise DeadlineExceeded(
                    f"the upload sent nothing for {UPLOAD_IDLE_SECONDS:g} s; it was ended and "
                    "nothing of it was stored", reason="UPLOAD_IDLE",
                    metadata={"idle_seconds": f"{UPLOAD_IDLE_SECONDS:g}"})
    finally:
        done.set()


class AuthInterceptor(_BehaviorInterceptor):
    def __init__(self, authorizer: Authorizer) -> None:
        super().__init__()
        self._authorizer = authorizer

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        authorizer = self._authorizer
        if authorizer.is_public(method):
            return behavior

        def metadata_of(context: grpc.ServicerContext) -> dict[str, str]:
            return call_metadata(context.invocation_metadata())

        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                metadata = metadata_of(context)
                token = bind_principal(authorizer.authorize(method, metadata), method)
                try:
                    checked = time.monotonic()
                    for message in behavior(request, context):
                        # A token revoked or expired, or its agent suspended, while the stream
                        # runs: the stream ends there (TOKEN_REVOKED, TOKEN_EXPIRED...), not
                        # when its data does. Checked against the verifier's cache and the
                        # restrictions in memory: no call to governance.
                        if time.monotonic() - checked >= STREAM_RECHECK_SECONDS:
                            authorizer.authorize(method, metadata)
                            checked = time.monotonic()
                        yield message
                finally:
                    unbind_principal(token)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            metadata = metadata_of(context)
            token = bind_principal(authorizer.authorize(method, metadata), method)
            try:
                if isinstance(request, Iterator):  # request-streaming: an upload
                    # Its caller authorized again each second: a token revoked mid-upload
                    # ends the call there, nothing stored.
                    request = _client_stream(
                        request, lambda: authorizer.authorize(method, metadata))
                return behavior(request, context)
            finally:
                unbind_principal(token)

        return unary


class MetricsInterceptor(_BehaviorInterceptor):
    """Standard ``grpc_server_*`` metrics (the go-grpc-prometheus names)."""

    def __init__(self, metrics: GrpcMetrics) -> None:
        super().__init__()
        self._metrics = metrics

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        grpc_type = "server_stream" if streaming else "unary"
        observe = self._metrics.for_method(method, grpc_type)

        def code_of(context: grpc.ServicerContext, failed: bool) -> str:
            code = status_code(context)
            if code is None:
                return "UNKNOWN" if failed else "OK"
            return str(code.name)

        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                start = time.perf_counter()
                observe.started()
                failed = True
                try:
                    yield from behavior(request, context)
                    failed = False
                finally:
                    observe.handled(code_of(context, failed), time.perf_counter() - start)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            observe.started()
            failed = True
            try:
                response = behavior(request, context)
                failed = False
                return response
            finally:
                observe.handled(code_of(context, failed), time.perf_counter() - start)

        return unary


class LoggingInterceptor(_BehaviorInterceptor):
    """One structured line per RPC at DEBUG; failures at WARNING."""

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        if streaming:
            return behavior

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            try:
                return behavior(request, context)
            finally:
                code = status_code(context)
                elapsed_ms = round((time.perf_counter() - start) * 1000, 3)
                if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # A refusal under load, counted by code and reason in the metrics (a full
                    # disk is warned of where it is mapped); a warning for each would spend
                    # the CPU refusing saves (most of a refusal's cost, profiled under 2x load).
                    log.debug("rpc refused", extra={"method": method, "elapsed_ms": elapsed_ms})
                elif code not in (None, grpc.StatusCode.OK):
                    log.warning(
                        "rpc failed",
                        extra={"method": method, "code": code.name, "elapsed_ms": elapsed_ms},
                    )
                elif log.isEnabledFor(logging.DEBUG):
                    log.debug("rpc", extra={"method": method, "elapsed_ms": elapsed_ms})

        return unary


class ConcurrencyInterceptor(_BehaviorInterceptor):
    """Refuses a call past the service's in-flight limit before it runs (health excepted);
    a stream holds its slot until it ends."""

    def __init__(self, limit: ConcurrencyLimit, is_public: Callable[[str], bool]) -> None:
        super().__init__()
        self._limit = limit
        self._is_public = is_public

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        if self._is_public(method):
            return behavior
        limit = self._limit

        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                limit.enter()
                try:
                    yield from behavior(request, context)
                finally:
                    limit.leave()

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            limit.enter()
            try:
                return behavior(request, context)
            finally:
                limit.leave()

        return unary


class StreamLimitInterceptor(_BehaviorInterceptor):
    """An agent's streams (server streams and uploads) open at once, and its fleet's, bounded
    (:class:`StreamsPerAgent`); service principals and public methods pass (runs inside
    :class:`AuthInterceptor`). A stream's place is given back once, when its generator ends:
    data exhausted, an error, or gRPC dropping it after a cancellation or a deadline (the
    same moment :class:`ConcurrencyInterceptor` frees the stream's slot)."""

    def __init__(self, streams: StreamsPerAgent, kinds: MethodKinds) -> None:
        super().__init__()
        self._streams = streams
        self._kinds = kinds

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        if method not in self._kinds:
            return behavior
        streams = self._streams
        if not streaming:

            def upload(request: Any, context: grpc.ServicerContext) -> Any:
                """A client stream (an upload) holds its slot while the client sends, as long
                as it likes: it counts as a stream too. Before 2026-11-29 it did not, and one
                agent's stalled uploads held every slot of the service (found by review)."""
                if not isinstance(request, Iterator):
                    return behavior(request, context)
                principal = current_principal()
                if is_service(principal):
                    return behavior(request, context)
                streams.enter(principal.fleet_id, principal.agent_id)
                try:
                    return behavior(request, context)
                finally:
                    streams.leave(principal.fleet_id, principal.agent_id)

            return upload

        def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            principal = current_principal()
            if is_service(principal):
                yield from behavior(request, context)
                return
            streams.enter(principal.fleet_id, principal.agent_id)
            try:
                yield from behavior(request, context)
            finally:
                streams.leave(principal.fleet_id, principal.agent_id)

        return stream


class RateLimitInterceptor(_BehaviorInterceptor):
    """Takes a token from the caller's bucket for the method's kind (read or write) before it
    runs; service principals and public methods pass (runs inside :class:`AuthInterceptor`)."""

    def __init__(self, limiter: RateLimiter, kinds: MethodKinds) -> None:
        super().__init__()
        self._limiter = limiter
        self._kinds = kinds

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        kind = self._kinds.get(method)
        if kind is None:  # public (health, reflection); every RPC of a service has a kind
            return behavior
        limiter = self._limiter

        def admit() -> None:
            principal = current_principal()
            if not is_service(principal):
                limiter.admit(principal.fleet_id, principal.agent_id, kind)

        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                admit()
                yield from behavior(request, context)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            admit()
            return behavior(request, context)

        return unary


class RecordRateInterceptor(_BehaviorInterceptor):
    """Takes one token a record from the caller's record bucket (:class:`RecordRate`) before a
    call that writes records runs: a batch is admitted whole or refused with nothing stored.
    Service principals pass; a request that did not parse passes to :class:`TextInterceptor`,
    which refuses it (runs inside :class:`AuthInterceptor` and :class:`RateLimitInterceptor`:
    a call refused for the call rate takes no record tokens)."""

    def __init__(self, rate: RecordRate, counts: RecordCounts) -> None:
        super().__init__()
        self._rate = rate
        self._counts = counts

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        count = self._counts.get(method)
        if count is None or streaming:
            return behavior
        rate = self._rate

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, Message):
                principal = current_principal()
                if not is_service(principal):
                    rate.admit(principal.fleet_id, principal.agent_id, count(request))
            return behavior(request, context)

        return unary


def _strings(field: FieldDescriptor, value: Any) -> list[tuple[str, Any]]:
    """(path suffix, value) of each element of a field: one, a list, or a map's entries."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return [(f"[{key!r}]", item) for key, item in value.items()] + [
            (f"[{key!r}] (key)", key) for key in value]
    if field.is_repeated:
        return [(f"[{i}]", item) for i, item in enumerate(value)]
    return [("", value)]


def nul_field(message: Message) -> str | None:
    """The path of the first string field of ``message`` (nested too) holding a NUL."""
    stack: list[tuple[Message, str]] = [(message, "")]
    while stack:
        current, prefix = stack.pop()
        for field, value in current.ListFields():
            for suffix, item in _strings(field, value):
                path = f"{prefix}{field.name}{suffix}"
                if isinstance(item, str):
                    if "\x00" in item:
                        return path
                elif isinstance(item, Message):
                    stack.append((item, f"{path}."))
    return None


def refuse_nul(message: Any) -> None:
    path = nul_field(message) if isinstance(message, Message) else None
    if path is not None:
        raise InvalidArgument(f"{path} contains a NUL character; text fields may not hold one",
                              reason="NUL_CHARACTER", metadata={"field": path})


class Undecodable:
    """A request whose bytes are not the method's message (what the tolerant parser gives)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def refuse(self) -> None:
        raise InvalidArgument(
            "the request is not a valid protobuf message for this method "
            f"({type(self.error).__name__})", reason="MALFORMED_REQUEST")


def _tolerant(parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``parse``, but bytes it cannot parse become :class:`Undecodable`: gRPC itself would
    answer INTERNAL ("Exception deserializing request!") before any interceptor ran."""
    if parse is None:
        return None

    def tolerant(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as error:  # DecodeError, or anything a parser raises on bad bytes
            return Undecodable(error)

    return tolerant


class TextInterceptor(_BehaviorInterceptor):
    """Refuses a request whose bytes do not parse (INVALID_ARGUMENT, not gRPC's INTERNAL) and a
    NUL character in any string field of any request, before any store sees it.

    Postgres cannot store a NUL in text (an INTERNAL error deep in a write) and SQLite would
    store what Postgres refuses: one rule for both keeps the contract the same.
    """

    def deserializer(self, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        return _tolerant(parse)

    def wrap(self, behavior: Behavior, method: str, streaming: bool) -> Behavior:
        def checked(request: Any) -> Any:
            if isinstance(request, Undecodable):
                request.refuse()
            if isinstance(request, Message):
                refuse_nul(request)
                return request
            return _checked_stream(request)

        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                yield from behavior(checked(request), context)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            return behavior(checked(request), context)

        return unary


def _checked_stream(requests: Iterator[Any]) -> Iterator[Any]:
    for request in requests:
        if isinstance(request, Undecodable):
            request.refuse()
        refuse_nul(request)
        yield request
