"""Identity against the four real servers: tokens expire, name their audience, and several
signing keys verify at once (rotation)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.common.tokens import TokenSigner, ensure_keypair, rotate_signing_key
from tests.conftest import TokenFactory
from tests.integration.common.stack import SERVICES, Stack, running_stack

OK = (grpc.StatusCode.OK, "")


@pytest.fixture
def stack(tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> Iterator[Stack]:
    with running_stack(tmp_path, engram_home, make_token, with_governance=False) as running:
        yield running


def test_a_token_past_its_expiry_is_refused_by_every_service(
        stack: Stack, engram_home: Path, make_token: TokenFactory) -> None:
    key = TokenSigner.load(engram_home / "auth" / "signing.key")._key
    an_hour_ago = TokenSigner(key, clock=lambda: time.time() - 3600)
    expired = an_hour_ago.issue("agent-1", "fleet-a", {"agent"}, ttl_seconds=600)
    fresh = make_token("agent-1", "fleet-a", ("agent",))
    for service in SERVICES:
        assert stack.probe(service, fresh) == OK, service
        assert stack.probe(service, expired) == (grpc.StatusCode.UNAUTHENTICATED,
                                                 "TOKEN_EXPIRED"), service


def test_a_token_expires_while_in_use(tmp_path: Path, engram_home: Path,
                                      make_token: TokenFactory) -> None:
    """A token verified (and cached) once is refused after its exp plus the leeway."""
    with running_stack(tmp_path, engram_home, make_token, with_governance=False,
                       settings=lambda _s: {"auth_leeway_seconds": 1}) as stack:
        short = TokenSigner.load(engram_home / "auth" / "signing.key").issue(
            "agent-1", "fleet-a", {"agent"}, ttl_seconds=2)
        assert stack.probe("shard", short) == OK
        deadline = time.monotonic() + 2 + 1 + 2  # ttl + leeway + slack
        while stack.probe("shard", short) == OK:
            assert time.monotonic() < deadline, "the expired token was still accepted"
            time.sleep(0.25)
        assert stack.probe("shard", short) == (grpc.StatusCode.UNAUTHENTICATED,
                                               "TOKEN_EXPIRED")


def test_a_token_for_another_audience_is_refused(stack: Stack,
                                                 make_token: TokenFactory) -> None:
    artifacts_only = make_token("agent-1", "fleet-a", ("agent",), audience=("artifacts",))
    assert stack.probe("artifacts", artifacts_only) == OK
    for service in ("shard", "governance", "compactor"):
        assert stack.probe(service, artifacts_only) == (grpc.StatusCode.UNAUTHENTICATED,
                                                        "TOKEN_AUDIENCE"), service


def test_rotation_old_and_new_keys_both_verify(tmp_path: Path, make_token: TokenFactory) -> None:
    """Rotate the signing key; services restarted with both public keys accept tokens of
    either; a token of a key no service was given is refused (UNAUTHENTICATED)."""
    home = tmp_path / "home"
    ensure_keypair(home)
    old = TokenSigner.load(home / "auth" / "signing.key")
    old_token = old.issue("agent-1", "fleet-a", {"agent"})
    stranger = tmp_path / "stranger"
    stranger_token = TokenSigner.load(ensure_keypair(stranger).private).issue(
        "agent-1", "fleet-a", {"agent"})
    rotate_signing_key(home)
    new_token = TokenSigner.load(home / "auth" / "signing.key").issue(
        "agent-1", "fleet-a", {"agent"})
    assert old.kid != TokenSigner.load(home / "auth" / "signing.key").kid

    (tmp_path / "stack").mkdir()
    with running_stack(tmp_path / "stack", home,
                       lambda agent="a", fleet="f", roles=("agent",), **kw: TokenSigner.load(
                           home / "auth" / "signing.key").issue(agent, fleet, set(roles)),
                       with_governance=False) as stack:
        for service in SERVICES:
            assert stack.probe(service, old_token) == OK, service
            assert stack.probe(service, new_token) == OK, service
            assert stack.probe(service, stranger_token) == (
                grpc.StatusCode.UNAUTHENTICATED, "TOKEN_KEY_UNKNOWN"), service
    # The old key retired once its tokens expired: services started without it refuse them.
    shutil.rmtree(home / "auth" / "keys")
    (tmp_path / "stack2").mkdir()
    with running_stack(tmp_path / "stack2", home,
                       lambda agent="a", fleet="f", roles=("agent",), **kw: TokenSigner.load(
                           home / "auth" / "signing.key").issue(agent, fleet, set(roles)),
                       with_governance=False) as stack:
        assert stack.probe("shard", new_token) == OK
        assert stack.probe("shard", old_token) == (grpc.StatusCode.UNAUTHENTICATED,
                                                   "TOKEN_KEY_UNKNOWN")
