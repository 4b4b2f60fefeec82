from __future__ import annotations

from pathlib import Path

import pytest

from services.common.auth import PUBLIC, Authorizer
from services.common.errors import InvalidArgument, PermissionDenied, Unauthenticated
from services.common.pagination import PageTokens
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
    pages = PageTokens.ephemeral()
    token = pages.encode([42], {"run": "r1"})
    assert pages.decode(token, {"run": "r1"}) == [42]
    assert pages.decode("", {"run": "r1"}) is None
    for bad, filters in ((token, {"run": "r2"}), ("%%%", {"run": "r1"}), ("e30", {})):
        with pytest.raises(InvalidArgument) as caught:
            pages.decode(bad, filters)
        assert caught.value.reason == "INVALID_PAGE_TOKEN"
    assert pages.page_size(0) == 50 and pages.page_size(5000) == 1000
    with pytest.raises(InvalidArgument):
        pages.page_size(-1)


def _refused(pages: PageTokens, token: str, filters: dict[str, str]) -> str:
    with pytest.raises(InvalidArgument) as caught:
        pages.decode(token, filters)
    assert caught.value.reason == "INVALID_PAGE_TOKEN"
    return caught.value.message


def test_page_tokens_are_signed_and_bound_to_the_caller() -> None:
    import base64
    import hashlib
    import json

    from services.common.auth import bind_principal, unbind_principal
    from services.common.tokens import Principal

    pages = PageTokens.ephemeral()
    filters = {"fleet": "f1"}
    bound = bind_principal(Principal("a1", "f1", frozenset({"agent"})))
    try:
        token = pages.encode([7], filters)
        assert pages.decode(token, filters) == [7]
        # The old format, forged: the filter digest is a plain hash anyone can compute.
        digest = hashlib.sha256(json.dumps(filters, sort_keys=True, separators=(",", ":"))
                                .encode()).hexdigest()[:16]
        forged = base64.urlsafe_b64encode(json.dumps({"k": [10**9], "f": digest}).encode())
        assert "not a token this service issued" in _refused(pages, forged.decode(), filters)
        body, signature = token.split(".")
        altered = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        altered["k"] = [10**9]
        altered_body = base64.urlsafe_b64encode(json.dumps(altered).encode()).decode()
        _refused(pages, f"{altered_body.rstrip('=')}.{signature}", filters)
        _refused(PageTokens.ephemeral(), token, filters)  # another service's (or replica's) key
    finally:
        unbind_principal(bound)
    other = bind_principal(Principal("a2", "f1", frozenset({"agent"})))
    try:
        assert "another caller" in _refused(pages, token, filters)
    finally:
        unbind_principal(other)


def test_a_page_token_is_bound_to_the_method_that_issued_it() -> None:
    """Found by review (2026-11-30): with one key for the four services (deploy/base), a shard
    ListDomains token, bound to the fleet alone, was taken by the compactor's ListPolicyRuns,
    whose key it is not, and failed INTERNAL."""
    from services.common.auth import bind_principal, unbind_principal
    from services.common.tokens import Principal

    shared = PageTokens.ephemeral()
    caller = Principal("a1", "f1", frozenset({"agent"}))
    bound = bind_principal(caller, "/engram.shard.v1.ShardService/ListDomains")
    try:
        token = shared.encode(["insights"], {"fleet": "f1"})
        assert shared.decode(token, {"fleet": "f1"}) == ["insights"]
    finally:
        unbind_principal(bound)
    bound = bind_principal(caller, "/engram.compactor.v1.CompactorService/ListPolicyRuns")
    try:
        assert "another caller" in _refused(shared, token, {"fleet": "f1"})
    finally:
        unbind_principal(bound)


def test_the_page_token_secret_is_made_once_private_or_read_from_the_setting(
        tmp_path: Path) -> None:
    from services.common.settings import ServerSettings

    settings = ServerSettings(home=tmp_path)
    first = PageTokens.for_service(settings, "shard")
    secret = tmp_path / "shard" / "page-token.key"
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    token = first.encode([1], {})
    assert PageTokens.for_service(settings, "shard").decode(token, {}) == [1]
    shared = tmp_path / "shared.key"
    shared.write_text("s" * 40)
    replica = ServerSettings(home=tmp_path / "elsewhere", page_token_key_file=shared)
    one, two = PageTokens.for_service(replica, "shard"), PageTokens.for_service(replica, "shard")
    assert two.decode(one.encode([3], {}), {}) == [3]
    shared.write_text("short")
    with pytest.raises(ValueError, match="page_token_key_file"):
        PageTokens.for_service(replica, "shard")
