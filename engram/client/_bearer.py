"""The ``Authorization`` header as the HTTP gateway and the MCP server read it before a call:
one reading for both (the services' own is ``services.common.auth.bearer_token``)."""

from __future__ import annotations

MAX_AUTHORIZATION_BYTES = 4096
"""An Engram token is a few hundred bytes; gRPC metadata past 8 KiB in all is refused with a
RESOURCE_EXHAUSTED a client would retry, at random below its hard limit."""


def malformed_authorization(value: str) -> str | None:
    """Why gRPC metadata cannot carry ``value`` as a token (non-ASCII or control characters:
    INTERNAL "Invalid metadata" from the channel; longer than any token), or None."""
    if not (value.isascii() and value.isprintable()):
        return "the Authorization header holds characters a token never has; send " \
            "'Bearer <token>'"
    if len(value) > MAX_AUTHORIZATION_BYTES:
        return (f"the Authorization header is {len(value)} bytes, over the "
                f"{MAX_AUTHORIZATION_BYTES} a token fits in; send 'Bearer <token>'")
    return None


def bearer_of(value: str) -> str:
    """The token of ``Bearer <token>`` (the scheme in any case, spaces around it ignored), or
    "" when the header holds none."""
    scheme, _, token = value.strip(" \t").partition(" ")
    return token.strip(" \t") if scheme.lower() == "bearer" else ""
