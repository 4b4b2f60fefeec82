"""Whose JSON body a request's is, for the gateway's body budget (found by reviews on
2026-11-29): a token is verified with the services' public keys and known by its own id (a
revoked token holds no share of its agent's new one); every token that does not verify is one
holder with a smaller share; a key the gateway has not loaded makes it read its sources again
(a rotation); it tolerates the services' clock skew (ENGRAM_AUTH_LEEWAY_SECONDS)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")

from engram.gateway import _holders
from engram.gateway._app import MAX_JSON_BODY, Gateway, GatewayConfig
from engram.gateway._budget import UNVERIFIED, BodyBudget, BodyRefused
from services.common.tokens import TokenSigner, ensure_keypair, key_paths

NOWHERE = {name: "127.0.0.1:1" for name in ("shard", "governance", "artifacts", "compactor")}


def _signer(home: Path) -> TokenSigner:
    ensure_keypair(home)
    return TokenSigner.load(key_paths(home).private)


def test_tokens_are_known_by_their_id_and_made_up_ones_share_one_holder(tmp_path: Path) -> None:
    signer = _signer(tmp_path)
    gateway = Gateway(GatewayConfig(NOWHERE, token_keys=(key_paths(tmp_path).public,)))
    first, second = (signer.issue("runner", "fleet-a", {"agent"}) for _ in range(2))
    holders = {gateway._body_holder(f"Bearer {t}") for t in (first, second)}
    assert len(holders) == 2 and UNVERIFIED not in holders  # one agent, two tokens
    assert gateway._body_holder(f"bearer  {first} ") == gateway._body_holder(f"Bearer {first}")
    for forged in ("Bearer forged-0", "Bearer a.b.c", "Basic dXNlcjpwdw==", ""):
        assert gateway._body_holder(forged) == UNVERIFIED


def test_the_unverified_holder_leaves_room_for_one_token_and_others() -> None:
    budget = BodyBudget(32, 16, 8)
    budget.lease(UNVERIFIED).take(8)
    with pytest.raises(BodyRefused):
        budget.lease(UNVERIFIED).take(1)
    budget.lease(b"mallory").take(16)
    budget.lease(b"runner").take(8)  # before: 503 BODIES_BUSY (unverified had 16 of 32)


def test_a_rotated_key_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    keys = tmp_path / "keys"
    keys.mkdir()
    _signer(old)
    shutil.copy(key_paths(old).public, keys / "old.pub")
    gateway = Gateway(GatewayConfig(NOWHERE, token_keys=(keys,)))
    token = _signer(new).issue("runner", "fleet-a", {"agent"})
    monkeypatch.setattr(_holders, "KEY_RELOAD_SECONDS", 0.0)
    assert gateway._body_holder(f"Bearer {token}") == UNVERIFIED  # not rotated yet
    shutil.copy(key_paths(new).public, keys / "new.pub")  # the Secret is updated in place
    time.sleep(0.01)
    assert gateway._body_holder(f"Bearer {token}") != UNVERIFIED


def test_the_services_leeway_is_the_gateways(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from engram.client import ClientSettings

    signer = _signer(tmp_path)
    monkeypatch.setenv("ENGRAM_AUTH_PUBLIC_KEY", str(key_paths(tmp_path).public))
    monkeypatch.setenv("ENGRAM_AUTH_LEEWAY_SECONDS", "120")
    config = GatewayConfig.from_settings(ClientSettings({"ENGRAM_HOME": str(tmp_path)}))
    assert config.token_leeway_seconds == 120.0
    signer._clock = lambda: time.time() - 61  # expired a second ago, within the leeway
    token = signer.issue("runner", "fleet-a", {"agent"}, ttl_seconds=60)
    assert Gateway(config)._body_holder(f"Bearer {token}") != UNVERIFIED
    monkeypatch.setenv("ENGRAM_AUTH_LEEWAY_SECONDS", "nope")
    with pytest.raises(ValueError, match="ENGRAM_AUTH_LEEWAY_SECONDS"):
        GatewayConfig.from_settings(ClientSettings({"ENGRAM_HOME": str(tmp_path)}))


def test_without_keys_the_gateway_says_so(tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    Gateway(GatewayConfig(NOWHERE))
    assert "no token public keys" in caplog.text
    assert GatewayConfig(NOWHERE).body_bytes_unverified == MAX_JSON_BODY


def test_a_rotation_under_engram_home_keeps_the_old_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: the first rotation under $ENGRAM_HOME made the reload read only the new
    `signing.pub` (the retired-keys directory did not exist at start), and every token of the
    old key, which the services accept until it expires, fell into the unverified share."""
    from engram.client import ClientSettings
    from services.common.tokens import rotate_signing_key

    monkeypatch.delenv("ENGRAM_AUTH_PUBLIC_KEY", raising=False)
    monkeypatch.delenv("ENGRAM_AUTH_PUBLIC_KEYS", raising=False)
    old = _signer(tmp_path).issue("runner", "fleet-a", {"agent"})
    gateway = Gateway(GatewayConfig.from_settings(ClientSettings({"ENGRAM_HOME":
                                                                  str(tmp_path)})))
    assert gateway._body_holder(f"Bearer {old}") != UNVERIFIED
    rotate_signing_key(tmp_path)
    new = TokenSigner.load(key_paths(tmp_path).private).issue("runner", "fleet-a", {"agent"})
    monkeypatch.setattr(_holders, "KEY_RELOAD_SECONDS", 0.0)
    assert gateway._body_holder(f"Bearer {new}") != UNVERIFIED
    assert gateway._body_holder(f"Bearer {old}") != UNVERIFIED
