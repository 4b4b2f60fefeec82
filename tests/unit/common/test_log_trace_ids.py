"""A JSON log line carries the current span's ids, and is never lost for them."""

from __future__ import annotations

import json
import logging
import sys
import types

import pytest

from services.common.logging_setup import JsonFormatter, current_trace_ids


def _line() -> dict[str, object]:
    record = logging.makeLogRecord({"msg": "hello", "levelno": logging.INFO,
                                    "levelname": "INFO", "name": "t"})
    entry: dict[str, object] = json.loads(JsonFormatter("shard").format(record))
    return entry


def test_a_half_imported_opentelemetry_gives_no_ids_and_the_line_is_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread importing ``opentelemetry.trace`` for the first time leaves the module in
    sys.modules before ``get_current_span`` exists in it."""
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", types.ModuleType("opentelemetry.trace"))
    assert current_trace_ids() == {}
    assert _line()["msg"] == "hello"


def test_a_failing_span_lookup_gives_no_ids_and_the_line_is_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("opentelemetry.trace")

    def get_current_span() -> None:
        raise RuntimeError("context broken")

    broken.get_current_span = get_current_span  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", broken)
    assert current_trace_ids() == {}
    assert _line()["msg"] == "hello"


def test_a_process_that_never_loaded_opentelemetry_gives_no_ids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "opentelemetry.trace", raising=False)
    assert current_trace_ids() == {}
