"""Client settings, parsed once from ``ENGRAM_*`` variables by the caller's ``main``.

Plain environment parsing (no pydantic): the client installs with grpcio, protobuf,
typer and rich alone.

| variable | field | default |
|---|---|---|
| ``ENGRAM_HOME`` | ``home`` | ``.engram`` |
| ``ENGRAM_TOKEN`` | ``token`` | the admin token ``engram up`` writes |
| ``ENGRAM_<SVC>_ADDR`` or ``_TARGET`` | ``<svc>_addr`` | ``$ENGRAM_HOME/endpoints.json``, 5005x |
| ``ENGRAM_TLS_CA``, ``_TLS_CERT``, ``_TLS_KEY`` | ``tls_ca``, ``tls_cert``, ``tls_key`` | none |
| ``ENGRAM_TIMEOUT_SECONDS`` | ``timeout_seconds`` | 30 |
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict


class TlsFiles(TypedDict, total=False):
    """The TLS keyword arguments of every client and of ``open_channel`` (``TlsFiles()``:
    none, a plaintext channel)."""

    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None


DEFAULT_PORTS = {"shard": 50051, "governance": 50052, "artifacts": 50053, "compactor": 50054}


@dataclass(frozen=True, init=False)
class ClientSettings:
    """``ClientSettings()`` reads the process environment; ``ClientSettings(environ)`` reads
    the mapping given (names are matched case-insensitively; an empty value counts as unset)."""

    home: Path
    token: str | None
    shard_addr: str
    governance_addr: str
    artifacts_addr: str
    compactor_addr: str
    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None
    timeout_seconds: float

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = {key.upper(): value for key, value in (os.environ if environ is None
                                                      else environ).items() if value}
        home = Path(env.get("ENGRAM_HOME", ".engram"))
        endpoints = _endpoints(home)
        fields: dict[str, object] = {
            "home": home,
            # A Secret made --from-file keeps the file's newline: as the admin token file's,
            # stripped (else every call was INTERNAL "Invalid metadata"; found in review).
            "token": env.get("ENGRAM_TOKEN", "").strip() or None,
            "tls_ca": _path(env.get("ENGRAM_TLS_CA")),
            "tls_cert": _path(env.get("ENGRAM_TLS_CERT")),
            "tls_key": _path(env.get("ENGRAM_TLS_KEY")),
            "timeout_seconds": _seconds(env.get("ENGRAM_TIMEOUT_SECONDS", "30")),
        }
        for service, port in DEFAULT_PORTS.items():
            prefix = f"ENGRAM_{service.upper()}_"
            fields[f"{service}_addr"] = (env.get(f"{prefix}ADDR") or env.get(f"{prefix}TARGET")
                                         or endpoints.get(service) or f"127.0.0.1:{port}")
        for name, value in fields.items():
            object.__setattr__(self, name, value)  # frozen: each field is set once, here

    def tls(self) -> TlsFiles:
        """The TLS keyword arguments every client takes (``tls_ca``, ``tls_cert``, ``tls_key``)."""
        return TlsFiles(tls_ca=self.tls_ca, tls_cert=self.tls_cert, tls_key=self.tls_key)

    def admin_token_path(self) -> Path:
        return self.home / "auth" / "admin.token"

    def resolve_token(self) -> str:
        if self.token:
            return self.token
        path = self.admin_token_path()
        if path.exists():
            return path.read_text().strip()
        raise FileNotFoundError(
            f"no token: set ENGRAM_TOKEN, or run `engram up` (it writes {path.absolute()}; "
            "ENGRAM_HOME, ./.engram unless set, is relative to where you run the command)")


def _endpoints(home: Path) -> dict[str, str]:
    """Where `engram up` said each service listens ($ENGRAM_HOME/endpoints.json), if it ran."""
    try:
        endpoints = json.loads((home / "endpoints.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(endpoints, dict):
        return {}
    return {str(name): str(address) for name, address in endpoints.items()}


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:  # 0 or NaN: every call at once past its
        raise ValueError(f"ENGRAM_TIMEOUT_SECONDS must be a positive number of seconds, "
                         f"got {value!r}") from None  # deadline, every stream cut
    return seconds
