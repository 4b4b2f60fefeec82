"""The shard's CompactRecords / ApplyRetention over gRPC, with the compactor's service token."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from engram.shard.v1 import shard_service_pb2 as pb
from engram.shard.v1 import shard_service_pb2_grpc as pb_grpc
from services.common.errors import (
    EngramError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from services.compactor.memory_policy import CompactedGroup, CompactionOutcome


class ShardCompactionGateway:
    """Implements :class:`MemoryCompactionPort` against a running shard service."""

    def __init__(self, address: str, token: str, timeout: float = 60.0) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.ShardServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._timeout = timeout

    def compact(self, fleet_id: str, importance_below: float, older_than_days: float,
                dry_run: bool) -> CompactionOutcome:
        request = pb.CompactRecordsRequest(fleet_id=fleet_id, importance_below=importance_below,
                                           older_than_days=older_than_days, dry_run=dry_run)
        try:
            reply = self._stub.CompactRecords(request, metadata=self._metadata,
                                              timeout=self._timeout)
        except grpc.RpcError as error:
            raise self._translate(error) from None
        groups = tuple(
            CompactedGroup(summary_id=g.summary.id if g.HasField("summary") else "",
                           replaced_ids=tuple(g.replaced_ids),
                           replaced_hashes=tuple(g.replaced_hashes), domain=g.domain,
                           run_id=g.run_id)
            for g in reply.groups)
        return CompactionOutcome(examined=reply.examined, compacted=reply.compacted,
                                 groups=groups)

    def apply_retention(self, fleet_id: str, older_than_days: float,
                        dry_run: bool) -> Sequence[str]:
        request = pb.ApplyRetentionRequest(fleet_id=fleet_id, older_than_days=older_than_days,
                                           dry_run=dry_run)
        try:
            reply = self._stub.ApplyRetention(request, metadata=self._metadata,
                                              timeout=self._timeout)
        except grpc.RpcError as error:
            raise self._translate(error) from None
        return list(reply.removed_ids)

    def _translate(self, error: grpc.RpcError) -> EngramError:
        code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
        detail = error.details() if isinstance(error, grpc.Call) else str(error)
        message = f"shard service at {self.address}: {detail}"
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return Unavailable(message, reason="SHARD_UNAVAILABLE")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidArgument(message)
        if code == grpc.StatusCode.NOT_FOUND:
            return NotFound(message)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return FailedPrecondition(
                f"{message} (check ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE: it must hold a token "
                "with role 'service')", reason="SHARD_REFUSED_SERVICE_TOKEN")
        return Internal(message, reason="SHARD_ERROR")

    def close(self) -> None:
        self._channel.close()
