"""Fuzzed requests against every RPC of every service (item 10 of issue 16).

The four services run as `engram up` runs them (each its own process, the shard gated). Every
method of every service, read from the generated descriptors (a new RPC is covered without
touching this file), gets hypothesis-generated requests of two kinds: raw bytes sent as the
serialized request (a generic channel, no client-side parsing), and well-formed messages with
random field values (huge, empty, unicode, NUL and control characters in strings; integers at
their bounds; long repeated fields; nested messages), each sent with no token, an agent's, a
governor's, an admin's or a service's. Streaming requests get a few such messages.

Criterion: every answer's status is one a client can act on (OK, INVALID_ARGUMENT, NOT_FOUND,
ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION,
OUT_OF_RANGE, ABORTED, DATA_LOSS of nothing stored... i.e. never INTERNAL, UNKNOWN or
UNIMPLEMENTED); no status message holds a stack trace or a source path; every service is
still alive and SERVING afterwards; each service's RSS grows by less than 150 MB.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.conftest import SERVICES, SOAK, Stack, health

pytestmark = [pytest.mark.faults]

EXAMPLES = int(os.environ.get("ENGRAM_FUZZ_EXAMPLES", 400 if SOAK else 12))  # per method, kind
ACCEPTABLE = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ABORTED,
}
LEAKS = ("Traceback", 'File "/', ".py\", line", "site-packages")
ROLES = ((), ("agent",), ("governor",), ("admin",), ("service",))
RSS_GROWTH_MB = 150


def _methods() -> list[tuple[str, MethodDescriptor]]:
    found = []
    for service in SERVICES:
        module = importlib.import_module(f"engram.{service}.v1.{service}_service_pb2")
        for descriptor in module.DESCRIPTOR.services_by_name.values():
            found += [(service, method) for method in descriptor.methods]
    return found


METHODS = _methods()

_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
    st.sampled_from(["", "\x00", "a\x00b", "../../etc/passwd", "' OR 1=1 --", "%s%n", "\u202e",
                     "fleet-f", "agent-1", "run-1", "x" * 5000, "{}", "[]", "null",
                     '{"a": ' * 200, "*", "(a+)+$", "2026-11-24T00:00:00Z"]),
)
_INTS = st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from([0, -1, 1, 2**31 - 1]))
_LONGS = st.one_of(st.integers(-2**63, 2**63 - 1), st.sampled_from([0, -1, 2**63 - 1]))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return _TEXT
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=2048)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [999])
    if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64,
                FieldDescriptor.TYPE_SFIXED64):
        return _LONGS
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    return _INTS


def _message(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    cls = GetMessageClass(descriptor)
    if depth > 2 or descriptor.full_name.startswith("google.protobuf."):
        return st.just(cls())
    fields = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value = st.dictionaries(_TEXT, _TEXT, max_size=20)
            else:
                one = _message(field.message_type, depth + 1)
                value = st.lists(one, max_size=4) if _repeated(field) else one
        else:
            value = st.lists(_scalar(field), max_size=300) if _repeated(field) \
                else _scalar(field)
        fields[field.name] = st.one_of(st.none(), value)

    def build(values: dict[str, Any]) -> Message:
        message = cls()
        for name, value in values.items():
            if value is None:
                continue
            field = descriptor.fields_by_name[name]
            try:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    target = getattr(message, name)
                    if field.message_type.GetOptions().map_entry:
                        target.update(value)
                    elif _repeated(field):
                        for item in value:
                            target.add().CopyFrom(item)
                    else:
                        target.CopyFrom(value)
                elif _repeated(field):
                    getattr(message, name).extend(value)
                else:
                    setattr(message, name, value)
            except (ValueError, TypeError):  # a value the field's type cannot hold
                continue
        return message

    return st.fixed_dictionaries({}, optional=fields).map(build)


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from services.common.tokens import TokenSigner, ensure_keypair, write_token_file

    home = tmp_path_factory.mktemp("fuzz")
    keys = ensure_keypair(home)
    signer = TokenSigner.load(keys.private)
    for name in SERVICES:
        write_token_file(home / "auth" / f"{name}.token",
                         signer.issue(f"svc-{name}", "system", {"service"}))
    stack = Stack(home, signer)
    try:
        for name in ("governance", "artifacts", "shard", "compactor"):
            stack.start(name)
        yield stack
    finally:
        stack.stop_all()


class Caller:
    """One channel per service, raw (bytes in, bytes out), and the failures seen."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.channels = {name: grpc.insecure_channel(stack.address(name)) for name in SERVICES}
        self.tokens = [stack.token("fuzz-agent", "fleet-fuzz", roles) if roles else ""
                       for roles in ROLES]
        self.bad: list[str] = []

    def call(self, service: str, method: MethodDescriptor, payloads: list[bytes],
             role: int) -> None:
        path = f"/{method.containing_service.full_name}/{method.name}"
        channel = self.channels[service]
        token = self.tokens[role % len(self.tokens)]
        metadata = [("authorization", f"Bearer {token}")] if token else []
        kwargs = {"request_serializer": None, "response_deserializer": None}
        try:
            if method.client_streaming and method.server_streaming:
                list(channel.stream_stream(path, **kwargs)(iter(payloads), metadata=metadata,
                                                           timeout=10))
            elif method.client_streaming:
                channel.stream_unary(path, **kwargs)(iter(payloads), metadata=metadata,
                                                     timeout=10)
            elif method.server_streaming:
                for _ in channel.unary_stream(path, **kwargs)(payloads[0], metadata=metadata,
                                                              timeout=10):
                    pass
            else:
                channel.unary_unary(path, **kwargs)(payloads[0], metadata=metadata, timeout=10)
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""  # type: ignore[attr-defined]
            if code not in ACCEPTABLE or any(leak in details for leak in LEAKS):
                self.bad.append(f"{path} role={ROLES[role % len(ROLES)]}: {code.name}: "
                                f"{details[:200]} <- {payloads[0][:120]!r}")

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


@pytest.mark.parametrize(("service", "method"), METHODS,
                         ids=[f"{s}.{m.name}" for s, m in METHODS])
def test_fuzzed_requests_get_statuses_a_client_can_act_on(
    running: Stack, service: str, method: MethodDescriptor
) -> None:
    caller = Caller(running)
    request = method.input_type
    try:
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(payloads=st.lists(st.binary(max_size=512), min_size=1, max_size=3),
               role=st.integers(0, len(ROLES) - 1))
        def raw(payloads: list[bytes], role: int) -> None:
            caller.call(service, method, payloads, role)

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(messages=st.lists(_message(request), min_size=1, max_size=3),
               role=st.integers(0, len(ROLES) - 1))
        def structured(messages: list[Message], role: int) -> None:
            caller.call(service, method, [m.SerializeToString() for m in messages], role)

        raw()
        structured()
    finally:
        caller.close()
    assert not caller.bad, "\n".join(caller.bad[:20])
    assert health(running.address(service), timeout=5) == 1, f"{service} is not SERVING"


def test_every_service_survived_the_fuzzing_with_bounded_memory(running: Stack) -> None:
    """Runs last in this module (after every method's fuzzing): alive, SERVING, RSS bounded."""
    for name in SERVICES:
        process = running.popen(name)
        assert process.poll() is None, f"{name} exited with {process.returncode}"
        deadline = time.monotonic() + 10
        while health(running.address(name)) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert health(running.address(name)) == 1, name


@pytest.fixture(scope="module", autouse=True)
def rss_bound(running: Stack) -> Iterator[None]:
    before = {name: _rss_mb(running.popen(name).pid) for name in SERVICES}
    yield
    grown = {name: _rss_mb(running.popen(name).pid) - before[name] for name in SERVICES
             if running.popen(name).poll() is None}
    print(f"RSS before (MB): { {k: round(v) for k, v in before.items()} }; growth during "
          f"fuzzing: { {k: round(v, 1) for k, v in grown.items()} }")
    assert all(value < RSS_GROWTH_MB for value in grown.values()), grown
