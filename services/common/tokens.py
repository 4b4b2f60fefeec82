"""Bearer tokens: Ed25519-signed principals.

A token is ``egt1.<payload>.<signature>`` (both base64url, no padding); the
payload is JSON ``{agent_id, fleet_id, roles, iat, jti}``. Services hold only
the public key, so a compromised service can check tokens but cannot mint
them (a governor token in particular). The signing key lives with whoever
issues tokens: ``engram token create`` and ``engram up`` on the local default.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from services.common.errors import InvalidArgument, Unauthenticated

TOKEN_PREFIX = "egt1"
ROLES = frozenset({"agent", "governor", "admin", "service"})
_MAX_ID_LEN = 128


@dataclass(frozen=True)
class Principal:
    """Who is calling: taken from a verified token, never from a request field."""

    agent_id: str
    fleet_id: str
    roles: frozenset[str] = field(default_factory=frozenset)

    def has_any(self, roles: frozenset[str]) -> bool:
        return bool(self.roles & roles)


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def validate_identifier(kind: str, value: str) -> str:
    if not value or len(value) > _MAX_ID_LEN:
        raise InvalidArgument(f"{kind} must be 1..{_MAX_ID_LEN} characters, got {len(value)}")
    if not all(c.isalnum() or c in "-_.:@" for c in value) or not value.strip("."):
        raise InvalidArgument(
            f"{kind} {value!r} may hold only letters, digits and - _ . : @, and not only dots",
            reason="INVALID_IDENTIFIER",
        )
    return value


class TokenSigner:
    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key

    @classmethod
    def load(cls, path: Path) -> TokenSigner:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} is not an Ed25519 private key")
        return cls(key)

    def issue(self, agent_id: str, fleet_id: str, roles: set[str] | frozenset[str]) -> str:
        validate_identifier("agent_id", agent_id)
        validate_identifier("fleet_id", fleet_id)
        unknown = set(roles) - ROLES
        if unknown or not roles:
            raise InvalidArgument(f"roles must be a non-empty subset of {sorted(ROLES)}")
        payload = {
            "agent_id": agent_id,
            "fleet_id": fleet_id,
            "roles": sorted(roles),
            "iat": int(time.time()),
            "jti": secrets.token_hex(8),
        }
        body = _b64e(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        signature = self._key.sign(f"{TOKEN_PREFIX}.{body}".encode())
        return f"{TOKEN_PREFIX}.{body}.{_b64e(signature)}"


class TokenVerifier:
    """Checks signatures; remembers tokens it has already verified (they are immutable)."""

    _CACHE_LIMIT = 4096

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        self._key = public_key
        self._verified: dict[str, Principal] = {}

    @classmethod
    def load(cls, path: Path) -> TokenVerifier:
        key = serialization.load_pem_public_key(path.read_bytes())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{path} is not an Ed25519 public key")
        return cls(key)

    def verify(self, token: str) -> Principal:
        cached = self._verified.get(token)
        if cached is not None:
            return cached
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
            raise Unauthenticated("malformed bearer token", reason="TOKEN_MALFORMED")
        try:
            self._key.verify(_b64d(parts[2]), f"{parts[0]}.{parts[1]}".encode())
            payload = json.loads(_b64d(parts[1]))
            principal = Principal(
                agent_id=str(payload["agent_id"]),
                fleet_id=str(payload["fleet_id"]),
                roles=frozenset(str(r) for r in payload["roles"]),
            )
        except InvalidSignature:
            raise Unauthenticated(
                "bearer token signature is not valid for this deployment",
                reason="TOKEN_SIGNATURE_INVALID",
            ) from None
        except (ValueError, KeyError, TypeError):
            raise Unauthenticated("malformed bearer token", reason="TOKEN_MALFORMED") from None
        if len(self._verified) >= self._CACHE_LIMIT:
            self._verified.clear()
        self._verified[token] = principal
        return principal


@dataclass(frozen=True)
class KeyPaths:
    private: Path
    public: Path


def key_paths(home: Path) -> KeyPaths:
    return KeyPaths(private=home / "auth" / "signing.key", public=home / "auth" / "signing.pub")


def ensure_keypair(home: Path) -> KeyPaths:
    """Create the deployment's signing key pair under ``home/auth`` once."""
    paths = key_paths(home)
    if paths.private.exists() and paths.public.exists():
        return paths
    paths.private.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.private.parent, 0o700)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write_private(paths.private, private_pem)
    paths.public.write_bytes(public_pem)
    return paths


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_token_file(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, (token + "\n").encode())
