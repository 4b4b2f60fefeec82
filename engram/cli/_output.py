"""Shared CLI plumbing: settings, JSON vs rich output, error exit codes."""

from __future__ import annotations

import functools
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import typer
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from engram.client._errors import EngramRpcError
from engram.client._settings import ClientSettings

console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")
P = ParamSpec("P")

JSON_OPTION = typer.Option(
    False,
    "--json",
    help="Print machine-readable JSON instead of tables: numbers as numbers, each *_json field "
    "as the JSON it holds under its name without the suffix (metadata_json -> metadata), "
    "times in RFC 3339 and absent when never set.",
)
SERVER_EXTRA = "pip install 'engram[server]'"
_INT64 = frozenset({FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64})

_settings: ClientSettings | None = None


def settings() -> ClientSettings:
    """The client settings, parsed once per process."""
    global _settings
    if _settings is None:
        _settings = ClientSettings()
    return _settings


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str, ensure_ascii=False) + "\n")


def message_dict(message: Message) -> dict[str, Any]:
    """A message as ``--json`` prints it: proto field names, every field without presence
    (defaults included), 64-bit integers as numbers (proto JSON makes them strings), each
    ``<name>_json`` string parsed under ``<name>``, and no time that was never set."""
    document = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _plain(message, document)


def _plain(message: Message, document: dict[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if name not in document:
            continue
        value, nested = document[name], field.message_type
        if nested is not None and nested.full_name == Timestamp.DESCRIPTOR.full_name:
            if when(getattr(message, name)):
                plain[name] = value
        elif name.endswith("_json") and field.type == FieldDescriptor.TYPE_STRING:
            plain[name.removesuffix("_json")] = _parsed(value)
        elif field.cpp_type in _INT64:
            plain[name] = [int(v) for v in value] if field.is_repeated else int(value)
        elif nested is not None and not nested.GetOptions().map_entry:
            proto = getattr(message, name)
            plain[name] = ([_plain(m, d) for m, d in zip(proto, value, strict=True)]
                           if field.is_repeated else _plain(proto, value))
        else:
            plain[name] = value
    return plain


def _parsed(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def when(stamp: Timestamp) -> str:
    """RFC 3339, or "" for a time never set (the epoch is what an unset one reads as)."""
    return stamp.ToJsonString() if stamp.seconds or stamp.nanos else ""


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one error line (never wrapped, brackets shown as written); the Exit to raise."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


class IntegrityFailure(typer.Exit):
    """A verify command found something altered, missing or unexplained: exit 1."""

    def __init__(self) -> None:
        super().__init__(1)


def verify_exits(command: Callable[P, None]) -> Callable[P, None]:
    """A verify command's exit codes: 1 only for an :class:`IntegrityFailure`; any other
    failure (a mistake on the command line, a missing token, a call that failed) is 2, "could
    not finish" (found in review, 2026-11-30: a missing token or a forgotten argument exited 1,
    which a script reads as tampering)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except IntegrityFailure:
            raise
        except typer.Exit as ended:
            if ended.exit_code == 1:
                raise typer.Exit(2) from None
            raise
        except Exception:  # a bug or a broken pipe: not verified, and not tampering (1)
            traceback.print_exc()
            raise typer.Exit(2) from None

    return run


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path`` (``what`` it should hold), or one error line naming the file
    and exit 1: a traceback was printed for a gzipped or binary file."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise fail(f"cannot read {path}: not UTF-8 text (byte {error.start} is not); it must "
                   f"hold {what}") from None
    except OSError as error:
        raise fail(f"cannot read {path}: {error.strerror or error}") from None


@contextmanager
def server_extra(command: str) -> Iterator[None]:
    """Runs a command that needs the services' dependencies; without them installed, one
    line naming the extra to install and exit 1."""
    try:
        yield
    except ModuleNotFoundError as error:
        raise fail(
            f"`engram {command}` needs the server extra: {SERVER_EXTRA} "
            f"(module {error.name!r} is not installed)"
        ) from None


def error_document(error: EngramRpcError) -> dict[str, Any]:
    """A failed call as --json prints it."""
    return {"code": error.code.name, "reason": error.reason, "message": error.message,
            "metadata": error.metadata}


def status_line(text: str, as_json: bool) -> AbstractContextManager[object]:
    """What a long step is doing, on standard error while it runs (none with --json)."""
    return nullcontext() if as_json else err_console.status(text)


def count_progress(label: str, disabled: bool, *, on: Console = console,
                   transient: bool = False) -> Progress:
    """A bar of items done out of a total (or a count without one), with the time left."""
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=on, disable=disabled, transient=transient)


@contextmanager
def rpc_errors(as_json: bool = False) -> Iterator[None]:
    """Print a failed call as a person-readable line (or JSON) and exit non-zero."""
    try:
        yield
    except EngramRpcError as error:
        if as_json:
            emit_json({"error": error_document(error)})
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
