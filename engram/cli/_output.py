"""Shared CLI plumbing: settings, JSON vs rich output, error exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console

from engram.client._errors import EngramRpcError
from engram.client._settings import ClientSettings

console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")

JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")

_settings: ClientSettings | None = None


def settings() -> ClientSettings:
    """The client settings, parsed once per process."""
    global _settings
    if _settings is None:
        _settings = ClientSettings()
    return _settings


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str, ensure_ascii=False) + "\n")


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@contextmanager
def rpc_errors(as_json: bool = False) -> Iterator[None]:
    """Print a failed call as a person-readable line (or JSON) and exit non-zero."""
    try:
        yield
    except EngramRpcError as error:
        if as_json:
            emit_json(
                {
                    "error": {
                        "code": error.code.name,
                        "reason": error.reason,
                        "message": error.message,
                        "metadata": error.metadata,
                    }
                }
            )
            raise typer.Exit(2) from None
        hint = f" [{error.reason}]" if error.reason else ""
        if error.code.name == "UNAVAILABLE" and not error.reason:
            hint = " (is the service running? start everything with `make up`)"
        raise fail(f"{error.code.name}: {error.message}{hint}", 2) from None
    except FileNotFoundError as error:
        raise fail(str(error)) from None


def with_client(factory: Callable[[ClientSettings], T]) -> T:
    """A client from the settings; a missing token or TLS file, or TLS settings that do not
    go together, is an error line and exit 1, not a traceback."""
    try:
        return factory(settings())
    except (OSError, ValueError) as error:
        raise fail(str(error)) from None
