from __future__ import annotations

from pathlib import Path

import pytest

from services.common.auth import PUBLIC, Authorizer
from services.common.errors import InvalidArgument, PermissionDenied, Unauthenticated
from services.common.pagination import decode_token, encode_token, page_size
from services.common.tokens import TokenSigner, TokenVerifier, ensure_keypair


def test_tokens_round_trip_and_refuse_forgeries(tmp_path: Path) -> None:
    keys = ensure_keypair(tmp_path)
    assert oct(keys.private.stat().st_mode & 0o777) == "0o600"
    token = TokenSigner.load(keys.private).issue("a1", "f1", {"agent", "governor"})
    principal = TokenVerifier.load(keys.public).verify(token)
    assert (principal.agent_id, principal.fleet_id) == ("a1", "f1")
    assert principal.roles == {"agent", "governor"}

    other = ensure_keypair(tmp_path / "other")
    forged = TokenSigner.load(other.private).issue("a1", "f1", {"admin"})
    with pytest.raises(Unauthenticated) as caught:
        TokenVerifier.load(keys.public).verify(forged)
    assert caught.value.reason == "TOKEN_KEY_UNKNOWN"
    impostor = TokenSigner.load(other.private)
    impostor.kid = TokenSigner.load(keys.private).kid  # claims our key id, signed with its own
    with pytest.raises(Unauthenticated) as caught:
        TokenVerifier.load(keys.public).verify(impostor.issue("a1", "f1", {"admin"}))
    assert caught.value.reason == "TOKEN_SIGNATURE_INVALID"
    head, body, sig = token.split(".")
    with pytest.raises(Unauthenticated):
        TokenVerifier.load(keys.public).verify(f"{head}.{body}x.{sig}")
    with pytest.raises(Unauthenticated):
        TokenVerifier.load(keys.public).verify("not-a-token")


def test_issue_validates_input(tmp_path: Path) -> None:
    signer = TokenSigner.load(ensure_keypair(tmp_path).private)
    with pytest.raises(InvalidArgument):
        signer.issue("a b", "f", {"agent"})
    with pytest.raises(InvalidArgument):
        signer.issue("a", "f", {"root"})


def test_authorizer_fails_closed(tmp_path: Path) -> None:
    keys = ensure_keypair(tmp_path)
    verifier = TokenVerifier.load(keys.public)
    agent = TokenSigner.load(keys.private).issue("a1", "f1", {"agent"})
    authz = Authorizer(
        verifier,
        {"/s/Read": frozenset({"agent"}), "/s/Admin": frozenset({"admin"}), "/s/Open": PUBLIC},
    )
    assert authz.authorize("/s/Read", {"authorization": f"Bearer {agent}"}).agent_id == "a1"
    assert authz.authorize("/s/Open", {}) is None
    assert authz.authorize("/grpc.health.v1.Health/Check", {}) is None
    with pytest.raises(Unauthenticated):
        authz.authorize("/s/Read", {})
    with pytest.raises(PermissionDenied) as caught:
        authz.authorize("/s/Admin", {"authorization": f"Bearer {agent}"})
    assert caught.value.reason == "ROLE_REQUIRED"
    with pytest.raises(PermissionDenied) as caught:
        authz.authorize("/s/Unlisted", {"authorization": f"Bearer {agent}"})
    assert caught.value.reason == "METHOD_NOT_AUTHORIZED"


def test_page_tokens_are_bound_to_their_query() -> None:
    token = encode_token([42], {"run": "r1"})
    assert decode_token(token, {"run": "r1"}) == [42]
    assert decode_token("", {"run": "r1"}) is None
    for bad, filters in ((token, {"run": "r2"}), ("%%%", {"run": "r1"}), ("e30", {})):
        with pytest.raises(InvalidArgument) as caught:
            decode_token(bad, filters)
        assert caught.value.reason == "INVALID_PAGE_TOKEN"
    assert page_size(0) == 50 and page_size(5000) == 1000
    with pytest.raises(InvalidArgument):
        page_size(-1)
