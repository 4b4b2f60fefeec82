"""The HTTP/1.1 protocol the gateway serves with: uvicorn's h11 protocol plus a header timeout.

uvicorn has none: a client that sends its request line and headers a byte at a time, or opens
a connection and sends nothing, holds that connection (and its memory) for as long as it likes,
so a few hundred such clients took every connection an operator allows (found by review on
2026-11-29). Here a connection whose request headers have not all arrived within
``header_timeout`` seconds of its opening, or of the end of its previous response, is closed.
A request body is not covered: the gateway's own body timeouts apply to it (docs/gateway.md).

An answer the client does not read is not held either: uvicorn writes a whole unary answer into
the transport's buffer (a page of records can be tens of MB) and closes the connection
gracefully, which waits for the buffer to drain, for ever if the client never reads; a dozen
such connections took a pod's memory (found by review on 2026-11-30). Once an answer is
complete, a connection that sends less than :data:`MIN_DRAIN_BYTES` of what it has buffered in
``header_timeout`` seconds is aborted; counted in bytes sent, so the next answer on the
connection, a stream whose buffer stays near full while it drains, is not cut.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT = 10.0
MIN_DRAIN_BYTES = 64 * 1024
"""How much of a complete answer's buffered bytes the client must take every header timeout."""
log = logging.getLogger("engram.gateway")


def header_timed(header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> type[H11Protocol]:
    """uvicorn's h11 protocol class, closing connections whose headers come too slowly."""

    class HeaderTimedProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _drain_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._counted = _CountingTransport(transport)
            super().connection_made(cast(asyncio.Transport, self._counted))
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._waiting():  # a request's line and headers are in
                self._disarm()
            elif self._header_timer is None:
                self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._waiting():
                self._arm()  # the next request's headers (or the rest of an unread body)
            if self._drain_timer is not None:
                self._drain_timer.cancel()
            self._watch_drain(None)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._drain_timer is not None:
                self._drain_timer.cancel()
                self._drain_timer = None
            super().connection_lost(exc)

        def _watch_drain(self, before: int | None) -> None:
            """Abort the connection when the bytes it sent (written, less those still
            buffered) grew by less than MIN_DRAIN_BYTES in a header timeout while some are
            buffered (``before``: the bytes sent one header timeout ago; None on the first
            look). Counted in bytes sent, not in the buffer's size: a stream answering the
            next request on the connection keeps its buffer near full while it drains."""
            self._drain_timer = None
            buffered = self.transport.get_write_buffer_size()
            if not buffered:
                return
            sent = self._counted.written - buffered
            if before is not None and sent - before < MIN_DRAIN_BYTES:
                log.warning("the client stopped reading its answer; connection aborted",
                            extra={"client": str(self.client), "buffered_bytes": buffered,
                                   "header_timeout_s": header_timeout})
                self.transport.abort()
                return
            self._drain_timer = self.loop.call_later(header_timeout, self._watch_drain, sent)

        def _waiting(self) -> bool:
            """No request being served: waiting for the next headers, or for the rest of a
            body the answer was sent without (401, 429, 408 ...)."""
            return self.conn.their_state is h11.IDLE or self.conn.our_state is h11.DONE

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._waiting() and not self.transport.is_closing():
                log.warning("request headers did not arrive in time; connection closed",
                            extra={"client": str(self.client),
                                   "header_timeout_s": header_timeout})
                self.transport.close()  # an answer still buffered is the drain watch's

    return HeaderTimedProtocol


class _CountingTransport:
    """A transport that counts the bytes written to it; everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
