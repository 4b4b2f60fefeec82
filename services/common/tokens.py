"""Bearer tokens: JWTs signed with Ed25519 (EdDSA), checked with any of several public keys.

A token is a standard JWT (RFC 7519) so other stacks can mint and check it:

- header ``{"alg": "EdDSA", "typ": "JWT", "kid": <key id>}``; the key id is the first 16 hex
  digits of SHA-256 over the raw 32-byte public key, so it is derived, never configured;
- claims ``sub`` (agent id), ``fleet``, ``roles``, ``aud`` (the services it may call, from
  :data:`AUDIENCES`), ``iss`` (:data:`ISSUER`), ``iat``, ``exp`` and ``jti``.

Services hold only public keys, so a compromised service can check tokens but cannot mint
them. A verifier holds every public key it was given and picks one by ``kid``: during a key
rotation tokens of the old key and of the new one both verify. The signing key lives with
whoever issues tokens (``engram token create``, ``engram up``): ``$ENGRAM_HOME/auth/signing.key``
is always the newest; :func:`rotate_signing_key` keeps the retired public keys under
``$ENGRAM_HOME/auth/keys/`` so services keep accepting the old tokens until they expire.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from services.common.errors import InvalidArgument, Unauthenticated

ROLES = frozenset({"agent", "governor", "admin", "service"})
AUDIENCES = ("shard", "governance", "artifacts", "compactor", "embedder")
"""The services a token may name in ``aud``; each service accepts only tokens naming it."""
ISSUER = "engram"
ALGORITHM = "EdDSA"
DEFAULT_AGENT_TTL_SECONDS = 24 * 3600
DEFAULT_SERVICE_TTL_SECONDS = 30 * 24 * 3600
"""Service and admin tokens written by ``engram up`` (renewed by it when near expiry)."""
MAX_TTL_SECONDS = 366 * 24 * 3600
_MAX_ID_LEN = 128
_REQUIRED_CLAIMS = ["sub", "fleet", "roles", "aud", "iss", "iat", "exp", "jti"]
PUBLIC_KEY_SUFFIXES = (".pub", ".pem")
log = logging.getLogger("engram.tokens")


@dataclass(frozen=True)
class Principal:
    """Who is calling: taken from a verified token, never from a request field."""

    agent_id: str
    fleet_id: str
    roles: frozenset[str] = field(default_factory=frozenset)
    token_id: str = ""
    """The token's ``jti`` (what a revocation names)."""
    issued_at: int = 0
    """``iat``, seconds since the epoch (an agent revocation cuts off tokens issued before it)."""
    expires_at: int = 0
    """``exp``, seconds since the epoch."""

    def has_any(self, roles: frozenset[str]) -> bool:
        return bool(self.roles & roles)


def is_identifier(value: str) -> bool:
    """Whether ``value`` is an id every service takes (what :func:`validate_identifier` checks)."""
    return (0 < len(value) <= _MAX_ID_LEN and bool(value.strip("."))
            and all(c.isalnum() or c in "-_.:@" for c in value))


def validate_identifier(kind: str, value: str) -> str:
    if not value or len(value) > _MAX_ID_LEN:
        raise InvalidArgument(f"{kind} must be 1..{_MAX_ID_LEN} characters, got {len(value)}")
    if not is_identifier(value):
        raise InvalidArgument(
            f"{kind} {value!r} may hold only letters, digits and - _ . : @, and not only dots",
            reason="INVALID_IDENTIFIER",
        )
    return value


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex digits of SHA-256 over the raw public key: the JWT ``kid``."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _validate_audience(audience: Iterable[str]) -> list[str]:
    chosen = sorted(set(audience))
    unknown = set(chosen) - set(AUDIENCES)
    if unknown or not chosen:
        raise InvalidArgument(f"audience must be a non-empty subset of {list(AUDIENCES)}, "
                              f"got {sorted(chosen)}", reason="INVALID_AUDIENCE")
    return chosen


class TokenSigner:
    def __init__(self, private_key: Ed25519PrivateKey, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = private_key
        self._clock = clock
        self.kid = key_id(private_key.public_key())

    @classmethod
    def load(cls, path: Path) -> TokenSigner:
        return cls(_load_private_key(path))

    def issue(self, agent_id: str, fleet_id: str, roles: Collection[str], *,
              ttl_seconds: int = DEFAULT_AGENT_TTL_SECONDS,
              audience: Iterable[str] = AUDIENCES) -> str:
        validate_identifier("agent_id", agent_id)
        validate_identifier("fleet_id", fleet_id)
        unknown = set(roles) - ROLES
        if unknown or not roles:
            raise InvalidArgument(f"roles must be a non-empty subset of {sorted(ROLES)}")
        if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
            raise InvalidArgument(f"ttl must be 1..{MAX_TTL_SECONDS} seconds, got {ttl_seconds}",
                                  reason="INVALID_TTL")
        now = int(self._clock())
        claims = {
            "sub": agent_id,
            "fleet": fleet_id,
            "roles": sorted(roles),
            "aud": _validate_audience(audience),
            "iss": ISSUER,
            "iat": now,
            "exp": now + ttl_seconds,
            "jti": secrets.token_hex(16),
        }
        return jwt.encode(claims, self._key, algorithm=ALGORITHM, headers={"kid": self.kid})


def _load_private_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(path.read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} is not an Ed25519 public key")
    return key


def load_public_keys(sources: Iterable[Path]) -> dict[str, Ed25519PublicKey]:
    """Every public key in ``sources`` by key id: a file is one PEM key, a directory gives
    each ``*.pub`` / ``*.pem`` in it. A source that does not exist is an error."""
    keys: dict[str, Ed25519PublicKey] = {}
    for source in sources:
        if source.is_dir():
            files = sorted(p for p in source.iterdir()
                           if p.suffix in PUBLIC_KEY_SUFFIXES and p.is_file())
        elif source.exists():
            files = [source]
        else:
            raise FileNotFoundError(f"no token public key at {source}")
        for path in files:
            key = load_public_key(path)
            keys[key_id(key)] = key
    return keys


def _unauthenticated(message: str, reason: str) -> Unauthenticated:
    return Unauthenticated(message, reason=reason)


class TokenVerifier:
    """Checks a token's signature (by its ``kid``), expiry, audience and issuer; remembers
    the tokens it has verified, rechecking their expiry on every use."""

    _CACHE_LIMIT = 4096

    def __init__(self, keys: Mapping[str, Ed25519PublicKey], *, audience: str | None,
                 leeway_seconds: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        if not keys:
            raise ValueError("a token verifier needs at least one public key")
        self._keys = dict(keys)
        self._audience = audience
        self._leeway = leeway_seconds
        self._clock = clock
        self._verified: dict[str, Principal] = {}

    @classmethod
    def load(cls, sources: Path | Iterable[Path], *, audience: str | None = None,
             leeway_seconds: float = 30.0) -> TokenVerifier:
        paths = [sources] if isinstance(sources, Path) else list(sources)
        return cls(load_public_keys(paths), audience=audience, leeway_seconds=leeway_seconds)

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def now(self) -> float:
        return self._clock()

    def verify(self, token: str) -> Principal:
        principal = self._verified.get(token)
        if principal is None:
            principal = self._decode(token)
            if len(self._verified) >= self._CACHE_LIMIT:
                self._verified.clear()
            self._verified[token] = principal
        if principal.expires_at + self._leeway < self._clock():
            raise _unauthenticated(
                f"bearer token {principal.token_id} expired at {principal.expires_at}; "
                "ask for a new one (`engram token create`)", "TOKEN_EXPIRED")
        return principal

    def _decode(self, token: str) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise _unauthenticated("malformed bearer token", "TOKEN_MALFORMED") from None
        kid = header.get("kid")
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise _unauthenticated(
                f"bearer token key id {kid!r} is not one this deployment accepts (a retired "
                "signing key, or another deployment's)", "TOKEN_KEY_UNKNOWN")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=[ALGORITHM], audience=self._audience, issuer=ISSUER,
                leeway=self._leeway,
                # Times are checked against this verifier's clock (below, and on every use).
                options={"require": _REQUIRED_CLAIMS, "verify_aud": self._audience is not None,
                         "verify_exp": False, "verify_iat": False, "verify_nbf": False})
        except jwt.InvalidSignatureError:
            raise _unauthenticated("bearer token signature is not valid for this deployment",
                                   "TOKEN_SIGNATURE_INVALID") from None
        except jwt.InvalidAudienceError:
            raise _unauthenticated(
                f"bearer token is not meant for the {self._audience} service (its aud claim "
                "does not name it)", "TOKEN_AUDIENCE") from None
        except jwt.PyJWTError as error:
            raise _unauthenticated(f"malformed bearer token: {error}",
                                   "TOKEN_MALFORMED") from None
        principal = _principal(claims)
        if principal.expires_at - principal.issued_at > MAX_TTL_SECONDS:
            # No signer here issues one: governance drops an agent's revocation from the
            # restrictions once every token it could refuse has expired, counting on this.
            raise _unauthenticated(
                f"bearer token {principal.token_id} lives longer than "
                f"{MAX_TTL_SECONDS // 86400} days (exp - iat); ask for a new one",
                "TOKEN_MALFORMED")
        not_before = max(principal.issued_at, _int_claim(claims, "nbf"))
        if not_before > self._clock() + self._leeway:
            raise _unauthenticated(f"bearer token {principal.token_id} is not valid before "
                                   f"{not_before} (check the issuer's clock)",
                                   "TOKEN_NOT_YET_VALID")
        return principal


def _int_claim(claims: Mapping[str, Any], name: str) -> int:
    value = claims.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _unauthenticated(f"malformed bearer token: {name} is not a number",
                               "TOKEN_MALFORMED")
    return int(value)


def _principal(claims: Mapping[str, Any]) -> Principal:
    try:
        roles = frozenset(claims["roles"])
        principal = Principal(
            agent_id=validate_identifier("sub", claims["sub"]),
            fleet_id=validate_identifier("fleet", claims["fleet"]),
            roles=roles, token_id=str(claims["jti"]), issued_at=_int_claim(claims, "iat"),
            expires_at=_int_claim(claims, "exp"))
    except (InvalidArgument, TypeError, ValueError):
        raise _unauthenticated("malformed bearer token: bad sub, fleet, roles, iat or exp",
                               "TOKEN_MALFORMED") from None
    if not roles or not roles <= ROLES or not principal.token_id:
        raise _unauthenticated(f"malformed bearer token: roles must be a non-empty subset of "
                               f"{sorted(ROLES)} and jti non-empty", "TOKEN_MALFORMED")
    return principal


def needs_renewal(token: str, current: TokenVerifier, *, min_remaining: float = 1 / 3) -> bool:
    """True when ``token`` no longer verifies with ``current`` (expired, malformed, signed by
    an earlier key) or has less than ``min_remaining`` of its lifetime left."""
    try:
        principal = current.verify(token)
    except Unauthenticated:
        return True
    lifetime = principal.expires_at - principal.issued_at
    return principal.expires_at - current.now() < lifetime * min_remaining


@dataclass(frozen=True)
class KeyPaths:
    private: Path
    """The newest signing key: every new token is signed with it."""
    public: Path
    retired: Path
    """Directory of earlier public keys, still accepted until their tokens expire."""


def key_paths(home: Path) -> KeyPaths:
    auth = home / "auth"
    return KeyPaths(private=auth / "signing.key", public=auth / "signing.pub",
                    retired=auth / "keys")


def ensure_keypair(home: Path) -> KeyPaths:
    """Create the deployment's signing key pair under ``home/auth`` once, and keep
    ``signing.pub`` the public key of ``signing.key``, which signs every new token: a rotation
    interrupted between its two files (a kill, ENOSPC) left one missing or another key's, and
    every new token failed to verify until the next rotation (found by review). It is written
    again from the private key; one it replaces stays accepted under ``auth/keys/``."""
    paths = key_paths(home)
    if not paths.private.exists():
        _write_keypair(paths)
        return paths
    public = _load_private_key(paths.private).public_key()
    try:
        found: Ed25519PublicKey | None = load_public_key(paths.public)
    except (OSError, ValueError):  # missing, or not a whole key
        found = None
    if found is not None and key_id(found) == key_id(public):
        return paths
    if found is not None and not (paths.retired / f"{key_id(found)}.pub").exists():
        paths.retired.mkdir(parents=True, exist_ok=True)
        _write_atomic(paths.retired / f"{key_id(found)}.pub", paths.public.read_bytes(), 0o644)
    _write_atomic(paths.public, _public_pem(public), 0o644)
    log.warning("%s was not the public key of %s (an interrupted key rotation?); written again "
                "from it (key id %s)%s", paths.public, paths.private, key_id(public),
                f", {key_id(found)} kept under {paths.retired}" if found is not None else "")
    return paths


def _public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo)


def _write_keypair(paths: KeyPaths) -> None:
    """The public key first: killed between the two files, the old private key still signs,
    and its public key is still accepted (``rotate_signing_key`` retired it first), where the
    reverse order left a new private key no verifier knew. :func:`ensure_keypair` then writes
    ``signing.pub`` again from the private key."""
    paths.private.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.private.parent, 0o700)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_atomic(paths.public, _public_pem(key.public_key()), 0o644)
    _write_private(paths.private, private_pem)


def rotate_signing_key(home: Path) -> tuple[str, str]:
    """Retire the current signing key (its public key moves to ``auth/keys/<kid>.pub``, still
    accepted) and create a new one; return ``(old kid, new kid)``."""
    paths = ensure_keypair(home)
    old = load_public_key(paths.public)
    old_kid = key_id(old)
    paths.retired.mkdir(parents=True, exist_ok=True)
    _write_atomic(paths.retired / f"{old_kid}.pub", paths.public.read_bytes(), 0o644)
    _write_keypair(paths)
    return old_kid, key_id(load_public_key(paths.public))


def local_public_keys(home: Path) -> list[Path]:
    """The local default key sources: the current public key and the retired ones."""
    paths = key_paths(home)
    return [paths.public, *([paths.retired] if paths.retired.is_dir() else [])]


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """``path`` holds the old bytes or ``data`` after a crash: a temp file fsynced, renamed over
    it, then the directory fsynced (else the rename could be lost). A failed write (ENOSPC)
    removes its temp file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _write_private(path: Path, data: bytes) -> None:
    _write_atomic(path, data, 0o600)


def write_token_file(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, (token + "\n").encode())
