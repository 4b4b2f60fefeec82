"""Tokens are standard JWTs (EdDSA) with an expiry, an audience and a key id; several keys
verify at once so a signing key can be rotated with no downtime."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from services.common.errors import InvalidArgument, Unauthenticated
from services.common.tokens import (
    AUDIENCES,
    MAX_TTL_SECONDS,
    TokenSigner,
    TokenVerifier,
    ensure_keypair,
    load_public_key,
    load_public_keys,
    local_public_keys,
    rotate_signing_key,
)
from tests.fsyncs import record_fsyncs


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _segment(token: str, index: int) -> dict[str, object]:
    part = token.split(".")[index]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


def test_token_is_a_standard_jwt_with_every_claim(tmp_path: Path) -> None:
    keys = ensure_keypair(tmp_path)
    signer = TokenSigner.load(keys.private)
    token = signer.issue("a1", "f1", {"agent"}, ttl_seconds=600, audience=["shard"])
    header, claims = _segment(token, 0), _segment(token, 1)
    raw = load_public_key(keys.public).public_bytes(serialization.Encoding.Raw,
                                                    serialization.PublicFormat.Raw)
    assert header == {"alg": "EdDSA", "typ": "JWT", "kid": hashlib.sha256(raw).hexdigest()[:16]}
    assert claims["sub"] == "a1" and claims["fleet"] == "f1" and claims["roles"] == ["agent"]
    assert claims["aud"] == ["shard"] and claims["iss"] == "engram"
    assert claims["exp"] == claims["iat"] + 600  # type: ignore[operator]
    assert isinstance(claims["jti"], str) and len(claims["jti"]) == 32
    # Another stack checks it with a stock JWT library and the PEM public key alone.
    other = jwt.decode(token, load_public_key(keys.public), algorithms=["EdDSA"], audience="shard")
    assert other["sub"] == "a1"
    principal = TokenVerifier.load(keys.public, audience="shard").verify(token)
    assert principal.token_id == claims["jti"] and principal.expires_at == claims["exp"]


def test_expired_token_is_refused_after_the_leeway(tmp_path: Path) -> None:
    keys = ensure_keypair(tmp_path)
    clock = Clock()
    signer = TokenSigner(TokenSigner.load(keys.private)._key, clock=clock)
    verifier = TokenVerifier(load_public_keys([keys.public]), audience="shard",
                             leeway_seconds=30, clock=clock)
    token = signer.issue("a1", "f1", {"agent"}, ttl_seconds=60)
    assert verifier.verify(token).agent_id == "a1"
    clock.now += 60 + 29
    assert verifier.verify(token).agent_id == "a1"  # within the skew leeway, cached
    clock.now += 2
    with pytest.raises(Unauthenticated) as caught:
        verifier.verify(token)
    assert caught.value.reason == "TOKEN_EXPIRED"
    fresh = TokenVerifier(load_public_keys([keys.public]), audience="shard", clock=clock)
    with pytest.raises(Unauthenticated) as caught:
        fresh.verify(token)  # never cached: refused as expired too
    assert caught.value.reason == "TOKEN_EXPIRED"


def test_audience_is_checked(tmp_path: Path) -> None:
    keys = ensure_keypair(tmp_path)
    token = TokenSigner.load(keys.private).issue("a1", "f1", {"agent"}, audience=["artifacts"])
    assert TokenVerifier.load(keys.public, audience="artifacts").verify(token).agent_id == "a1"
    with pytest.raises(Unauthenticated) as caught:
        TokenVerifier.load(keys.public, audience="shard").verify(token)
    assert caught.value.reason == "TOKEN_AUDIENCE"
    with pytest.raises(InvalidArgument):
        TokenSigner.load(keys.private).issue("a1", "f1", {"agent"}, audience=["database"])
    with pytest.raises(InvalidArgument):
        TokenSigner.load(keys.private).issue("a1", "f1", {"agent"}, ttl_seconds=0)


def test_claims_missing_or_forged_are_refused(tmp_path: Path) -> None:
    keys = ensure_keypair(tmp_path)
    signer = TokenSigner.load(keys.private)
    verifier = TokenVerifier.load(keys.public, audience="shard")
    private = signer._key
    now = int(time.time())
    base = {"sub": "a1", "fleet": "f1", "roles": ["agent"], "aud": list(AUDIENCES),
            "iss": "engram", "iat": now, "exp": now + 3600, "jti": "j1"}
    whole = jwt.encode(base, private, algorithm="EdDSA", headers={"kid": signer.kid})
    assert verifier.verify(whole).agent_id == "a1"  # each case below is refused for its own fault
    for missing in ("exp", "jti", "aud", "fleet"):
        claims = {k: v for k, v in base.items() if k != missing}
        token = jwt.encode(claims, private, algorithm="EdDSA", headers={"kid": signer.kid})
        with pytest.raises(Unauthenticated) as caught:
            verifier.verify(token)
        assert caught.value.reason == "TOKEN_MALFORMED", missing
    for bad in ({"roles": ["root"]}, {"iss": "someone-else"}, {"sub": "a b"}):
        token = jwt.encode({**base, **bad}, private, algorithm="EdDSA",
                           headers={"kid": signer.kid})
        with pytest.raises(Unauthenticated):
            verifier.verify(token)
    unsigned = jwt.encode(base, None, algorithm="none", headers={"kid": signer.kid})
    with pytest.raises(Unauthenticated):
        verifier.verify(unsigned)


def test_a_token_living_longer_than_any_signer_issues_is_refused(tmp_path: Path) -> None:
    """Governance drops an agent's revocation from the restrictions once every token it could
    refuse has expired (MAX_TTL_SECONDS after it); a token living longer, which no signer here
    issues, would then be taken again."""
    keys = ensure_keypair(tmp_path)
    signer = TokenSigner.load(keys.private)
    clock = Clock()
    verifier = TokenVerifier(load_public_keys([keys.public]), audience="shard", clock=clock)
    iat = int(clock.now) - 10
    base = {"sub": "a1", "fleet": "f1", "roles": ["agent"], "aud": list(AUDIENCES),
            "iss": "engram", "iat": iat, "jti": "j1"}
    for lifetime, accepted in ((MAX_TTL_SECONDS, True), (MAX_TTL_SECONDS + 1, False)):
        token = jwt.encode({**base, "exp": iat + lifetime}, signer._key, algorithm="EdDSA",
                           headers={"kid": signer.kid})
        if accepted:
            assert verifier.verify(token).agent_id == "a1"
            continue
        with pytest.raises(Unauthenticated) as caught:
            verifier.verify(token)
        assert caught.value.reason == "TOKEN_MALFORMED"
        assert "lives longer than 366 days" in caught.value.message


def test_rotation_keeps_old_tokens_valid_and_signs_with_the_new_key(tmp_path: Path) -> None:
    ensure_keypair(tmp_path)
    before = TokenVerifier.load(local_public_keys(tmp_path), audience="shard")
    old_signer = TokenSigner.load(tmp_path / "auth" / "signing.key")
    old_token = old_signer.issue("a1", "f1", {"agent"})
    old_kid, new_kid = rotate_signing_key(tmp_path)
    assert old_kid == old_signer.kid and new_kid != old_kid
    new_signer = TokenSigner.load(tmp_path / "auth" / "signing.key")
    assert new_signer.kid == new_kid
    new_token = new_signer.issue("a2", "f1", {"agent"})
    # Before the rotation only the old key was known: the new token is refused.
    with pytest.raises(Unauthenticated) as caught:
        before.verify(new_token)
    assert caught.value.reason == "TOKEN_KEY_UNKNOWN"
    verifier = TokenVerifier.load(local_public_keys(tmp_path), audience="shard")
    assert verifier.key_ids == {old_kid, new_kid}
    assert verifier.verify(old_token).agent_id == "a1"
    assert verifier.verify(new_token).agent_id == "a2"
    # The operator retires the old key once its tokens have expired.
    (tmp_path / "auth" / "keys" / f"{old_kid}.pub").unlink()
    retired = TokenVerifier.load(local_public_keys(tmp_path), audience="shard")
    with pytest.raises(Unauthenticated) as caught:
        retired.verify(old_token)
    assert caught.value.reason == "TOKEN_KEY_UNKNOWN"
    assert retired.verify(new_token).agent_id == "a2"


@pytest.mark.parametrize("failing", ["signing.pub", "signing.key"])
def test_a_rotation_out_of_space_leaves_a_pair_that_verifies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """Found by review: the new private key was put in place before its public key, so ENOSPC
    on the public key (or a kill between the two) left every new token failing verification;
    the failed write also left its temp file. Whichever file fails, the rotation is reported
    and a token signed with whatever signing.key holds verifies."""
    keys = ensure_keypair(tmp_path)
    old_token = TokenSigner.load(keys.private).issue("a1", "f1", {"agent"})
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/{failing}.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", full_disk)
        with pytest.raises(OSError, match="No space"):
            rotate_signing_key(tmp_path)
    token = TokenSigner.load(keys.private).issue("a2", "f1", {"agent"})
    verifier = TokenVerifier.load(local_public_keys(tmp_path))
    assert verifier.verify(token).agent_id == "a2"
    assert verifier.verify(old_token).agent_id == "a1"
    assert not list(keys.private.parent.glob("*.tmp"))
    ensure_keypair(tmp_path)  # what `engram up` and the provisioning scripts run first
    assert TokenVerifier.load(keys.public).verify(token).agent_id == "a2"


def test_ensure_keypair_writes_the_public_key_again_from_the_private_key(
        tmp_path: Path) -> None:
    """A rotation killed between its two files (the new signing.key next to the old
    signing.pub, as rotate-key left it before the public key went first) no longer leaves
    every new token unverifiable: ensure_keypair writes signing.pub again from signing.key and
    keeps the public key it replaces accepted."""
    keys = ensure_keypair(tmp_path)
    old_token = TokenSigner.load(keys.private).issue("a1", "f1", {"agent"})
    keys.private.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    new_token = TokenSigner.load(keys.private).issue("a2", "f1", {"agent"})
    ensure_keypair(tmp_path)
    assert TokenVerifier.load(keys.public).verify(new_token).agent_id == "a2"
    verifier = TokenVerifier.load(local_public_keys(tmp_path))
    assert verifier.verify(old_token).agent_id == "a1"
    assert verifier.verify(new_token).agent_id == "a2"


def test_a_rotation_syncs_the_directories_of_the_keys_it_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key renamed into place survives a power loss only once its directory is synced."""
    keys = ensure_keypair(tmp_path)
    synced = record_fsyncs(monkeypatch)
    rotate_signing_key(tmp_path)
    assert {keys.private.parent, keys.retired} <= set(synced)
