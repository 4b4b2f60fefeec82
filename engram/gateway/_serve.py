"""Running the gateway under uvicorn."""

from __future__ import annotations

from engram.client import ClientSettings
from engram.gateway._app import Gateway, GatewayConfig
from engram.gateway._http import DEFAULT_HEADER_TIMEOUT, header_timed


def serve(settings: ClientSettings, *, host: str = "127.0.0.1", port: int = 8080,
          log_level: str = "warning", body_min_bytes_per_s: float | None = None,
          uploads_per_token: int | None = None,
          stream_min_bytes_per_s: float | None = None,
          uploads_max: int | None = None,
          upload_answer_seconds: float | None = None,
          header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT) -> None:
    """Serve until interrupted; SIGTERM lets in-flight requests finish (uvicorn's graceful
    shutdown)."""
    import uvicorn

    given = {"body_min_bytes_per_s": body_min_bytes_per_s,
             "uploads_per_token": uploads_per_token,
             "stream_min_bytes_per_s": stream_min_bytes_per_s, "uploads_max": uploads_max,
             "upload_answer_seconds": upload_answer_seconds}
    overrides = {name: value for name, value in given.items() if value is not None}
    gateway = Gateway(GatewayConfig.from_settings(settings, **overrides))
    uvicorn.run(gateway.app(), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=10, http=header_timed(header_timeout_seconds))
