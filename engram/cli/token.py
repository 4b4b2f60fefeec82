"""`engram token`: mint, inspect and revoke bearer tokens, rotate the signing key.

Minting and rotating are the server side's (``services.common.tokens``, the signing key), so
those commands need the server extra and import it only when they run; `inspect` and `revoke`
are client commands (revoke asks governance, with a governor's token).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from engram.cli._output import (
    JSON_OPTION,
    console,
    emit_json,
    fail,
    message_dict,
    rpc_errors,
    server_extra,
    settings,
    with_client,
)
from engram.client.governance import GovernanceClient

if TYPE_CHECKING:
    from services.common.tokens import TokenSigner

app = typer.Typer(
    help="Bearer tokens: create (needs the signing key under $ENGRAM_HOME/auth), inspect, "
    "revoke, rotate the signing key.",
    no_args_is_help=True,
)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")


def duration_seconds(text: str) -> int:
    """``90``, ``30m``, ``24h``, ``7d`` -> seconds."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise typer.BadParameter(f"{text!r} is not a duration: a number with s, m, h or d "
                                 "(e.g. 30m, 24h, 7d)")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]


def token_claims(token: str) -> dict[str, Any]:
    """A JWT's header and claims, decoded WITHOUT checking the signature (display only)."""
    parts = token.strip().split(".")
    try:
        if len(parts) != 3:
            raise ValueError("a JWT has three dot-separated parts")
        header, claims = (json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))
                          for p in parts[:2])
    except (ValueError, binascii.Error) as error:
        raise fail(f"not a token this deployment issues (a JWT): {error}") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise fail("not a token this deployment issues: header and claims must be objects")
    return {"header": header, "claims": claims}


@app.command("create")
def create(
    agent: str = typer.Option(..., "--agent", help="agent id the token speaks for (sub)"),
    fleet: str = typer.Option(..., "--fleet", help="fleet (tenant) the agent belongs to"),
    role: list[str] = typer.Option(
        ["agent"], "--role", help="agent, governor, admin or service; repeat for several"
    ),
    ttl: str = typer.Option("24h", "--ttl", help="lifetime: 30m, 24h, 7d (at most 366d)"),
    audience: list[str] = typer.Option(
        [], "--audience",
        help="service it may call (shard, governance, artifacts, compactor); repeat; "
             "default all four"),
    key: Path | None = typer.Option(None, "--key", help="signing key (default: home/auth)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print a new token; use it with `ENGRAM_TOKEN=... engram ...`."""
    with server_extra("token create"):
        from services.common.errors import InvalidArgument
        from services.common.tokens import AUDIENCES, key_paths
    signer = load_signer(key or key_paths(settings().home).private)
    try:
        token = signer.issue(agent, fleet, set(role), ttl_seconds=duration_seconds(ttl),
                             audience=audience or AUDIENCES)
    except InvalidArgument as error:
        raise fail(error.message) from None
    if as_json:
        claims = token_claims(token)["claims"]
        emit_json({"token": token, "agent_id": agent, "fleet_id": fleet, "roles": sorted(role),
                   "jti": claims["jti"], "audience": claims["aud"],
                   "expires_at": datetime.fromtimestamp(claims["exp"], UTC).isoformat()})
    else:
        typer.echo(token)


@app.command("inspect")
def inspect(
    token: str = typer.Argument(None, help="the token (default: $ENGRAM_TOKEN or the admin "
                                           "token)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show a token's header and claims (its signature is NOT checked here)."""
    decoded = token_claims(token or with_client(lambda s: s.resolve_token()))
    if as_json:
        emit_json(decoded)
        return
    claims = decoded["claims"]
    for name, value in (("kid", decoded["header"].get("kid")), *claims.items()):
        if name in ("iat", "exp") and isinstance(value, int | float):
            value = f"{value} ({datetime.fromtimestamp(value, UTC).isoformat()})"
        console.print(f"{name}: {value}")


@app.command("revoke")
def revoke(
    token: str = typer.Option("", "--token", help="the token to revoke (its jti and exp are "
                                                  "read from it)"),
    jti: str = typer.Option("", "--jti", help="a token's jti (with --expires-at)"),
    expires_at: datetime | None = typer.Option(None, "--expires-at",
                                               help="that token's exp (UTC unless it says)"),
    agent: str = typer.Option("", "--agent", help="revoke every token of this agent issued "
                                                  "up to now"),
    fleet: str = typer.Option("", "--fleet", help="fleet (default: your token's fleet)"),
    reason: str = typer.Option("", "--reason", help="why, recorded in the witness chain"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Revoke one token (--token, or --jti with --expires-at) or all of an agent's (--agent);
    every service refuses them within its refresh interval (2 s by default). Governor role."""
    if sum(bool(x) for x in (token, jti, agent)) != 1:
        raise fail("give exactly one of --token, --jti (with --expires-at) or --agent")
    client = with_client(lambda s: GovernanceClient(s.governance_addr, s.resolve_token(),
                                                    **s.tls(), timeout=s.timeout_seconds))
    with client, rpc_errors(as_json):
        if agent:
            revoked_agent = client.revoke_agent_tokens(agent, fleet_id=fleet, reason=reason)
            if as_json:
                emit_json(message_dict(revoked_agent))
            else:
                console.print(f"revoked every token of {revoked_agent.agent_id} in "
                              f"{revoked_agent.fleet_id} issued up to "
                              f"{revoked_agent.issued_before.ToDatetime(UTC).isoformat()}")
            return
        subject = ""
        if token:
            claims = token_claims(token)["claims"]
            jti, subject = str(claims.get("jti", "")), str(claims.get("sub", ""))
            expires_at = datetime.fromtimestamp(float(claims.get("exp", 0)), UTC)
        if expires_at is None:
            raise fail("--jti needs --expires-at: the token's exp, so the revocation is kept "
                       "as long as the token could be used")
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        reply = client.revoke_token(jti, expires_at, fleet_id=fleet, agent_id=subject,
                                    reason=reason)
        if as_json:
            emit_json(message_dict(reply))
        else:
            state = "revoked" if reply.created else "was already revoked"
            console.print(f"token {reply.revoked.jti} {state} (until "
                          f"{reply.revoked.expire_time.ToDatetime(UTC).isoformat()})")


@app.command("rotate-key")
def rotate_key(as_json: bool = JSON_OPTION) -> None:
    """New signing key; the old public key stays accepted (home/auth/keys/) until you delete
    it once its tokens have expired. See docs/security.md for the whole rotation."""
    with server_extra("token rotate-key"):
        from services.common.tokens import rotate_signing_key
    old, new = rotate_signing_key(settings().home)
    if as_json:
        emit_json({"retired_kid": old, "signing_kid": new})
    else:
        console.print(f"new signing key {new}; {old} retired to "
                      f"{settings().home / 'auth' / 'keys' / (old + '.pub')} (still accepted). "
                      "Restart the services so they load the new key, then renew tokens.")


def load_signer(key_path: Path) -> TokenSigner:
    """The signer of the private key at ``key_path``, or one error line naming the file (a
    wrong file printed a ValueError traceback)."""
    from services.common.tokens import TokenSigner

    if not key_path.exists():
        raise fail(f"no signing key at {key_path}: run `engram up` once, or pass --key")
    try:
        return TokenSigner.load(key_path)
    except (OSError, ValueError, TypeError) as error:
        raise fail(f"cannot load the signing key {key_path}: {error} (an Ed25519 private key "
                   "in PEM, as `engram up` writes under .engram/auth/)") from None
