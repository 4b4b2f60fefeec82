"""The SDK's channels retry what a stopping or flaky server answers (fault test 7; issue 16).

A real gRPC server on 127.0.0.1 is stopped while 12 callers hammer it: the calls it had
received but not yet handed to a handler end CANCELLED on a plain channel (grpc/grpc#41785).
Through the SDK's channel no caller sees CANCELLED: such a call was never started and is
retried (against a server that is gone, it ends UNAVAILABLE once its attempts are used).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent import futures

import grpc

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.client import open_channel
from engram.client._channel import idempotency_key
from engram.client._retry import NOT_RETRIED, RETRIED, SERVICE_CONFIG
from engram.compactor.v1 import compactor_service_pb2 as cpb
from engram.embedder.v1 import embedder_service_pb2 as epb
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb


def _echo(request: bytes, _context: grpc.ServicerContext) -> bytes:
    time.sleep(0.0005)
    return request


# A retried method's name (the policy is per method); the bytes are echoed, not parsed.
_HANDLER = grpc.method_handlers_generic_handler(
    "engram.shard.v1.ShardService", {"GetStatus": grpc.unary_unary_rpc_method_handler(_echo)})


def _stops_under_load(make_channel, cycles: int = 8) -> Counter[str]:  # type: ignore[no-untyped-def]
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    for _ in range(cycles):
        server = grpc.server(futures.ThreadPoolExecutor(16))
        server.add_generic_rpc_handlers((_HANDLER,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        stop = threading.Event()

        def caller(port: int = port, stop: threading.Event = stop) -> None:
            with make_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary("/engram.shard.v1.ShardService/GetStatus")
                while not stop.is_set():
                    try:
                        call(b"", timeout=5)
                        outcome = "OK"
                    except grpc.RpcError as error:
                        outcome = error.code().name
                    with lock:
                        outcomes[outcome] += 1

        threads = [threading.Thread(target=caller) for _ in range(12)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        server.stop(5).wait()
        time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join()
    return outcomes


def test_no_caller_sees_cancelled_when_a_server_stops_under_load() -> None:
    through_sdk = _stops_under_load(open_channel)
    plain = _stops_under_load(grpc.insecure_channel)
    print(f"plain channel: {dict(plain)}; SDK channel: {dict(through_sdk)}")
    assert through_sdk["OK"] > 0
    assert through_sdk["CANCELLED"] == 0, dict(through_sdk)


def test_every_rpc_is_either_retried_or_named_with_the_reason_it_is_not() -> None:
    """A new RPC fails this test until someone decides whether a retry is safe for it."""
    methods = {f"{service.full_name}/{method.name}"
               for module in (apb, cpb, epb, gpb, spb)
               for service in module.DESCRIPTOR.services_by_name.values()
               for method in service.methods}
    retried = {f"{service}/{method}" for service, names in RETRIED.items() for method in names}
    assert not retried & set(NOT_RETRIED)
    assert retried | set(NOT_RETRIED) == methods, (
        f"undecided: {sorted(methods - retried - set(NOT_RETRIED))}; "
        f"unknown: {sorted((retried | set(NOT_RETRIED)) - methods)}")
    config = json.loads(SERVICE_CONFIG)
    (method_config,) = config["methodConfig"]
    assert len(method_config["name"]) == len(retried)
    assert set(method_config["retryPolicy"]["retryableStatusCodes"]) == {"UNAVAILABLE",
                                                                       "CANCELLED"}


def test_a_write_without_a_request_id_gets_its_own_key_and_a_given_one_is_kept() -> None:
    drawn = {idempotency_key() for _ in range(100)}
    assert len(drawn) == 100 and all(len(key) == 32 for key in drawn)
    assert idempotency_key("mine-1") == "mine-1"
