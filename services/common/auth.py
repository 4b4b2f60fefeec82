"""Authentication and per-method authorization.

Every RPC a service exposes has an explicit entry in its :data:`MethodPolicy`:
the caller kinds allowed to call it. A method with no entry is refused (fail
closed), so adding an RPC without deciding who may call it cannot open a hole.

A caller's kinds are its token's roles (``agent``, ``governor``, ``admin``,
``service``) plus, for a service principal, its identity: the token of role
``service`` whose agent id is ``svc-<name>`` is also ``service:<name>``
(``service:shard``, ``service:compactor`` ...). A table names an identity to let
only that service in, or ``service`` to let any service principal in.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping

from services.common.access import AccessRestrictions
from services.common.errors import PermissionDenied, Unauthenticated
from services.common.tokens import Principal, TokenVerifier, validate_identifier

SERVICE_ROLE = "service"
SERVICE_AGENT_PREFIX = "svc-"
SERVICE_FLEET = "system"
SERVICE_NAMES = ("shard", "governance", "artifacts", "compactor")


def service_identity(name: str) -> str:
    """The caller kind an access table names to admit one service (``service:shard``)."""
    return f"{SERVICE_ROLE}:{name}"


SHARD_SERVICE = service_identity("shard")
GOVERNANCE_SERVICE = service_identity("governance")
ARTIFACTS_SERVICE = service_identity("artifacts")
COMPACTOR_SERVICE = service_identity("compactor")
SERVICE_IDENTITIES = frozenset(service_identity(name) for name in SERVICE_NAMES)
PEOPLE = frozenset({"agent", "governor", "admin"})
"""Every role but ``service``: what a person or an agent may hold."""
PUBLIC: frozenset[str] = frozenset()
"""Marks a method callable without a token (health, reflection)."""

MethodPolicy = Mapping[str, frozenset[str]]

PUBLIC_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "engram_principal", default=None
)
_method: contextvars.ContextVar[str] = contextvars.ContextVar("engram_method", default="")


def service_principal(name: str) -> tuple[str, str, frozenset[str]]:
    """(agent id, fleet, roles) of the token service ``name`` presents to the others."""
    if name not in SERVICE_NAMES:
        raise ValueError(f"unknown service {name!r}; one of {', '.join(SERVICE_NAMES)}")
    return f"{SERVICE_AGENT_PREFIX}{name}", SERVICE_FLEET, frozenset({SERVICE_ROLE})


def bearer_token(header: str) -> str:
    """The token of an ``authorization: Bearer <token>`` header (the scheme in any case, spaces
    around the token ignored), or "" when it holds none. The one reading of the header: the
    adaptive admission keys callers by what it returns, so no spelling of one token counts as
    another caller."""
    scheme, _, token = header.strip(_HEADER_SPACE).partition(" ")
    return token.strip(_HEADER_SPACE) if scheme.lower() == "bearer" else ""


_HEADER_SPACE = " \t"
"""What may surround a token: spaces and tabs, as HTTP allows around a field value. Python's
bare strip() also took U+001C-U+001F and other Unicode spaces, which the front proxy's caller key
does not skip: one token then counted as two callers there (found in review)."""


def call_metadata(pairs: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """A call's text metadata as a dict. More than one ``authorization`` header is refused
    ``UNAUTHENTICATED TOKEN_AMBIGUOUS``: which one counts would depend on who reads them (a
    dict keeps the last, nginx's front proxy keys callers by the first), so a caller could be
    one agent to its limits and another to its authentication."""
    metadata: dict[str, str] = {}
    for key, value in pairs:
        if not isinstance(value, str):
            continue
        if key == "authorization" and key in metadata:
            raise Unauthenticated(
                "more than one authorization header: send exactly one "
                "'authorization: Bearer <token>'", reason="TOKEN_AMBIGUOUS")
        metadata[key] = value
    return metadata


def caller_kinds(principal: Principal) -> frozenset[str]:
    """The kinds an access table can name for this caller: its roles and, for a service
    principal, its identity (``service:<name>`` from the agent id ``svc-<name>`` of fleet
    ``system``; a token of another fleet is no service, found by a review on 2026-11-29)."""
    if SERVICE_ROLE not in principal.roles or principal.fleet_id != SERVICE_FLEET:
        return principal.roles
    name = principal.agent_id.removeprefix(SERVICE_AGENT_PREFIX)
    if principal.agent_id == f"{SERVICE_AGENT_PREFIX}{name}" and name in SERVICE_NAMES:
        return principal.roles | {service_identity(name)}
    return principal.roles


def is_service(principal: Principal) -> bool:
    """Whether the caller is one of Engram's services (role ``service`` in fleet ``system``),
    which carry many agents' work and so pass the per-agent rate, record and stream limits. A
    token with role ``service`` minted for another fleet is not (before 2026-11-29 it passed
    them too: found by a review)."""
    return SERVICE_ROLE in principal.roles and principal.fleet_id == SERVICE_FLEET


def is_caller(principal: Principal, kind: str) -> bool:
    """Whether this caller is of ``kind`` (a role or a service identity)."""
    return kind in caller_kinds(principal)


def current_principal() -> Principal:
    """The authenticated caller of the RPC being served."""
    principal = _principal.get()
    if principal is None:
        raise Unauthenticated("this call carries no authenticated principal")
    return principal


def optional_principal() -> Principal | None:
    """The authenticated caller, or ``None`` outside an authenticated RPC (a public method)."""
    return _principal.get()


def current_method() -> str:
    """The full name of the RPC being served (``/pkg.Service/Method``), or "" outside one."""
    return _method.get()


Bound = tuple[contextvars.Token[Principal | None], contextvars.Token[str]]


def bind_principal(principal: Principal | None, method: str = "") -> Bound:
    """Make ``principal`` (and the RPC ``method`` it calls) the current call's."""
    return _principal.set(principal), _method.set(method)


def unbind_principal(bound: Bound) -> None:
    _principal.reset(bound[0])
    _method.reset(bound[1])


class Authorizer:
    def __init__(self, verifier: TokenVerifier, policy: MethodPolicy,
                 restrictions: AccessRestrictions | None = None) -> None:
        self._verifier = verifier
        self._policy = dict(policy)
        self._restrictions = restrictions

    def is_public(self, method: str) -> bool:
        return method.startswith(PUBLIC_PREFIXES) or self._policy.get(method) == PUBLIC

    def admission_key(self, metadata: Mapping[str, str]) -> str:
        """Who is calling, for admission before the call runs: the fleet and agent of a token
        that verifies (cached per token), "" without a token (refused right after, by
        :meth:`authorize`). A token that does not verify raises here: a flood of forged tokens
        takes no place in the limit, and every token of one agent is one caller."""
        token = bearer_token(metadata.get("authorization", ""))
        if not token:
            return ""
        principal = self._verifier.verify(token)
        return f"{principal.fleet_id}\x1f{principal.agent_id}"

    def authorize(self, method: str, metadata: Mapping[str, str]) -> Principal | None:
        """Return the caller, or ``None`` for a public method; raise when refused."""
        if self.is_public(method):
            return None
        allowed = self._policy.get(method)
        if allowed is None:
            raise PermissionDenied(
                f"{method} has no authorization entry; refusing by default",
                reason="METHOD_NOT_AUTHORIZED",
            )
        token = bearer_token(metadata.get("authorization", ""))
        if not token:
            raise Unauthenticated(
                "missing bearer token: send 'authorization: Bearer <token>' "
                "(see `engram token create`)",
                reason="TOKEN_MISSING",
            )
        principal = self._verifier.verify(token)
        if self._restrictions is not None:
            self._restrictions.check(principal, method)
        kinds = caller_kinds(principal)
        if not kinds & allowed:
            raise PermissionDenied(
                f"{method} may be called only by {', '.join(sorted(allowed))}; "
                f"caller {principal.agent_id} is {', '.join(sorted(kinds))}",
                reason="ROLE_REQUIRED",
                metadata={"required_roles": ",".join(sorted(allowed))},
            )
        return principal


def target_fleet(principal: Principal, requested: str, *, cross_fleet: bool = False,
                 name_required: bool = False) -> str:
    """The fleet a call acts on: the caller's own unless ``cross_fleet`` lets it name another.

    ``cross_fleet`` is the caller's right to act for other fleets (a service principal, a gate
    caller), decided by the servicer; ``name_required`` refuses an empty fleet for such a
    caller, whose own fleet means nothing to the call.
    """
    if not requested:
        if name_required:
            raise PermissionDenied(f"{principal.agent_id} must name fleet_id for this call",
                                   reason="FLEET_REQUIRED")
        return principal.fleet_id
    if requested == principal.fleet_id:
        return principal.fleet_id
    if cross_fleet:
        return validate_identifier("fleet_id", requested)
    raise PermissionDenied(
        f"{principal.agent_id} belongs to fleet {principal.fleet_id!r} and cannot act on "
        f"fleet {requested!r}", reason="FLEET_MISMATCH")
