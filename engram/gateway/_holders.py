"""Whose request body a request's is, for a :class:`~engram.gateway._budget.BodyBudget` (the
gateway's JSON bodies, the MCP server's HTTP bodies).

With the services' public keys (``ENGRAM_AUTH_PUBLIC_KEY(S)``, else ``$ENGRAM_HOME``'s key
pair as ``engram up`` makes it) a bearer token is verified, only to know whose a body is, and
known by its own id (``jti``: a revoked token holds no share of its agent's new one); every
token that does not verify, and a request without one, is the one :data:`UNVERIFIED` holder
with a smaller share (made-up strings each got a budget of their own and filled the total:
found by review on 2026-11-29). The services still authorize every call. A token signed by a
key not loaded makes the sources be read again, at most every :data:`KEY_RELOAD_SECONDS` (a
key rotation; a projected Secret updates in place). Without keys, each Authorization value is
its own holder (:func:`~engram.gateway._budget.token_holder`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

from engram.client._bearer import bearer_of
from engram.gateway._budget import UNVERIFIED, token_holder
from services.common.errors import EngramError
from services.common.settings import TokenKeySettings
from services.common.tokens import TokenVerifier, load_public_keys

KEY_RELOAD_SECONDS = 30.0
"""How often, at most, a token signed by an unknown key makes the key sources be read again."""
log = logging.getLogger("engram.gateway")


def token_key_sources(keys: TokenKeySettings) -> tuple[Path, ...]:
    """The services' public key sources: those the environment names when it names any, else
    ``$ENGRAM_HOME``'s key pair when it has one (``engram up``); none otherwise."""
    sources = keys.public_key_sources()
    return tuple(sources) if keys.names_public_keys or sources[0].is_file() else ()


class BodyHolders:
    def __init__(self, token_keys: tuple[Path, ...], token_home: Path | None = None,
                 leeway_seconds: float = 30.0) -> None:
        """``token_home``: set when ``token_keys`` are that home's key pair, so that a reload
        works them out again (the retired-keys directory appears with the first rotation)."""
        self._sources, self._home, self._leeway = token_keys, token_home, leeway_seconds
        self._keys = self._read_keys()
        self._verifier = self._verifier_of(self._keys)
        self._keys_read = time.monotonic()

    @classmethod
    def of_home(cls, home: Path) -> BodyHolders:
        """The keys the services read, as a process given ``home`` finds them."""
        keys = TokenKeySettings(home=home)
        return cls(token_key_sources(keys), None if keys.names_public_keys else home,
                   keys.auth_leeway_seconds)

    @property
    def verifies(self) -> bool:
        """Whether tokens are verified (keys were found)."""
        return self._verifier is not None

    def holder(self, authorization: str) -> bytes:
        """Whose body a request with this Authorization value sends."""
        if self._verifier is None:
            return token_holder(authorization)
        token = bearer_of(authorization)
        try:
            principal = self._verifier.verify(token)
        except EngramError as error:
            if error.reason != "TOKEN_KEY_UNKNOWN" or not self._reload_keys():
                return UNVERIFIED
            try:
                principal = self._verifier.verify(token)
            except EngramError:
                return UNVERIFIED
        except ValueError:
            return UNVERIFIED
        return hashlib.sha256(
            f"{principal.fleet_id}\0{principal.agent_id}\0{principal.token_id}".encode()
        ).digest()

    def _read_keys(self) -> dict[str, Any]:
        sources = self._key_sources()
        return load_public_keys(sources) if sources else {}

    def _verifier_of(self, keys: dict[str, Any]) -> TokenVerifier | None:
        if not keys:
            return None
        return TokenVerifier(keys, audience=None, leeway_seconds=self._leeway)

    def _key_sources(self) -> tuple[Path, ...]:
        if self._home is not None:
            return token_key_sources(TokenKeySettings(home=self._home)) or self._sources
        return self._sources

    def _reload_keys(self) -> bool:
        """Read the key sources again (a key rotation), at most every KEY_RELOAD_SECONDS, and
        add the keys found to those loaded (a token of a retired key still verifies at the
        services until it expires); whether a key was added."""
        now = time.monotonic()
        if now - self._keys_read < KEY_RELOAD_SECONDS:
            return False
        self._keys_read = now
        try:
            found = self._read_keys()
        except (OSError, ValueError) as error:
            log.warning("token public keys could not be read again", extra={"error": str(error)})
            return False
        if set(found) <= set(self._keys):
            return False
        self._keys = {**self._keys, **found}
        log.info("token public keys read again", extra={"key_ids": sorted(self._keys)})
        self._verifier = self._verifier_of(self._keys)
        return True
