"""AIP-158 page tokens: opaque to clients, signed, bound to the caller and the query.

A token carries the last key of the page, a digest of the request's filters and a digest of
the caller (fleet and agent), signed with HMAC-SHA256 under a secret only the service holds.
A client can neither forge a token (a cursor past another fleet's rows) nor alter one; a
token reused with other filters, or by another caller, is refused. Each refusal is
INVALID_ARGUMENT with reason INVALID_PAGE_TOKEN. List handlers call
:meth:`PageTokens.paginate`: it fetches one row past the page, so a token is issued only
when another row exists (never a trailing empty page).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from services.common.auth import current_method, optional_principal
from services.common.errors import InvalidArgument
from services.common.limits import check_limit
from services.common.settings import LimitsSettings, ServerSettings

Row = TypeVar("Row")

DEFAULT_PAGE_SIZE = 50
KEY_FILE = "page-token.key"
_MIN_SECRET_BYTES = 32
_CONTEXT = b"engram-page-token-v1\x1f"


def _digest(value: Any) -> str:
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message, reason="INVALID_PAGE_TOKEN")


def _caller() -> list[str]:
    """Who asks, and through which RPC: a token one method issued is not another's, in this
    service or in another one sharing the key (deploy/base gives the four one key; a shard's
    ListDomains token passed to the compactor's ListPolicyRuns, both bound to the fleet alone,
    was taken and failed INTERNAL: found by review on 2026-11-30)."""
    principal, method = optional_principal(), current_method()
    caller = [principal.fleet_id, principal.agent_id] if principal is not None else []
    return [*caller, method] if method else caller


class PageTokens:
    """Issues and checks one service's page tokens."""

    def __init__(self, secret: bytes, limits: LimitsSettings | None = None) -> None:
        if len(secret) < _MIN_SECRET_BYTES:
            raise ValueError(f"a page-token secret needs at least {_MIN_SECRET_BYTES} bytes")
        self._secret = secret
        self._limits = limits or LimitsSettings()

    @classmethod
    def ephemeral(cls, limits: LimitsSettings | None = None) -> PageTokens:
        """A random secret for this process only (tests; tokens do not survive a restart)."""
        return cls(secrets.token_bytes(_MIN_SECRET_BYTES), limits)

    @classmethod
    def for_service(cls, settings: ServerSettings, service: str) -> PageTokens:
        """The secret from ``page_token_key_file``, else the service's data dir (made once)."""
        path = settings.page_token_key_file or settings.data_dir(service) / KEY_FILE
        if settings.page_token_key_file is None and not path.exists():
            _create_secret(path)
        try:
            secret = path.read_bytes().strip()
        except OSError as error:
            raise ValueError(f"cannot read the page-token secret {path} "
                             f"(page_token_key_file): {error.strerror}") from None
        if len(secret) < _MIN_SECRET_BYTES:
            raise ValueError(f"the page-token secret {path} holds {len(secret)} bytes; it needs "
                             f"at least {_MIN_SECRET_BYTES} random bytes (page_token_key_file)")
        return cls(secret, settings.limits)

    def derive(self, purpose: str, value: str) -> str:
        """A keyed digest (hex) of ``value`` for ``purpose``: stable in this deployment, which
        keeps the secret, and unpredictable to anyone else (governance derives an erasure's id
        from its request id with it, so no other fleet can compute the id beforehand)."""
        body = f"engram {purpose}\x00{value}".encode()
        return hmac.new(self._secret, body, hashlib.sha256).hexdigest()

    def page_size(self, requested: int) -> int:
        if requested < 0:
            raise InvalidArgument(f"page_size must be >= 0, got {requested}")
        if requested == 0:
            return min(DEFAULT_PAGE_SIZE, self._limits.page_size)
        return min(requested, self._limits.page_size)

    def _sign(self, body: str) -> bytes:
        return hmac.new(self._secret, _CONTEXT + body.encode(), hashlib.sha256).digest()

    def encode(self, last_key: list[Any], filters: dict[str, Any]) -> str:
        body = _b64e(json.dumps({"k": last_key, "f": _digest(filters), "c": _digest(_caller())},
                                separators=(",", ":")).encode())
        return f"{body}.{_b64e(self._sign(body))}"

    def decode(self, token: str, filters: dict[str, Any]) -> list[Any] | None:
        """The last key of the previous page, or ``None`` for the first page."""
        if not token:
            return None
        check_limit("page_token", len(token), self._limits.page_token_chars,
                    "ENGRAM_LIMITS_PAGE_TOKEN_CHARS", "characters", reason="INVALID_PAGE_TOKEN")
        body, _, signature = token.partition(".")
        try:
            valid = hmac.compare_digest(_b64d(signature), self._sign(body))
            fields = json.loads(_b64d(body)) if valid else None
        except (ValueError, UnicodeError):
            valid, fields = False, None
        if not valid or not isinstance(fields, dict) or not isinstance(fields.get("k"), list):
            raise _invalid("page_token is not a token this service issued: pass back the "
                           "next_page_token of the previous page unchanged")
        if fields.get("c") != _digest(_caller()):
            raise _invalid("page_token was issued to another caller, or by another call; start "
                           "from the first page")
        if fields.get("f") != _digest(filters):
            raise _invalid("page_token was issued for a different query; repeat the original "
                           "filters")
        key: list[Any] = fields["k"]
        return key

    def paginate(
        self,
        page_token: str,
        requested_size: int,
        filters: dict[str, Any],
        fetch: Callable[[list[Any] | None, int], Sequence[Row]],
        key_of: Callable[[Row], list[Any]],
        size_of: Callable[[Row], int] | None = None,
        max_bytes: int = 0,
    ) -> tuple[list[Row], str]:
        """One page and the token for the next (``""`` on the last page).

        ``fetch(after_key, limit)`` returns up to ``limit`` rows after ``after_key`` (``None``
        for the first page) in the listing's order; ``key_of(row)`` is that row's sort key.
        With ``size_of``, a page also stops before its rows' sizes pass ``max_bytes`` (its
        first row always goes), for rows whose size varies by orders of magnitude.
        The token is bound to the caller of the RPC being served.
        """
        after = self.decode(page_token, filters)
        size = self.page_size(requested_size)
        rows = list(fetch(after, size + 1))
        page = rows[:size]
        if size_of is not None:
            used = 0
            for index, row in enumerate(page):
                used += size_of(row)
                if index and used > max_bytes:
                    page = page[:index]
                    break
        if len(page) == len(rows):
            return page, ""
        return page, self.encode(key_of(page[-1]), filters)


def _create_secret(path: Path) -> None:
    """32 random bytes, hex, readable by the service's user only; a concurrent start keeps one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(_MIN_SECRET_BYTES) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)  # never replaces a secret another process wrote first
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
