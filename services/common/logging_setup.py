"""Structured JSON logs on stderr: one object per line.

Imports nothing of gRPC or the client: the embedder's child process configures its logging
here too, and each module it loads is memory it holds for its lifetime.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any


def current_trace_ids() -> dict[str, str]:
    """The current span's trace and span ids (hex), for a log line; empty outside a span.

    A process that never loaded OpenTelemetry's API has no span: it is not imported here."""
    trace = sys.modules.get("opentelemetry.trace")
    current_span = getattr(trace, "get_current_span", None)  # None while another thread imports it
    if current_span is None:
        return {}
    try:
        context = current_span().get_span_context()
    except Exception:  # a log line is never lost for its trace ids
        return {}
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"),
            "span_id": format(context.span_id, "016x")}

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        entry.update(current_trace_ids())  # inside a traced call: its trace and span ids
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(service: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
