"""The shard's CompactRecords / ApplyRetention through the SDK, with the compactor's service token.

A refusal from the shard keeps its gRPC code, reason and metadata (a gate denial stays
PERMISSION_DENIED / GATE_DENIED with its rule ids, a digest mismatch stays DATA_LOSS), raised
as the matching :mod:`services.common.errors` class so the compactor's caller sees it as is.
"""

from __future__ import annotations

from collections.abc import Sequence

from engram.client import EngramRpcError, ShardClient, TlsFiles
from services.common.errors import EngramError
from services.common.outbound import dependency_error
from services.compactor.domain.memory_policy import CompactedGroup, CompactionOutcome


def shard_error(address: str, error: EngramRpcError) -> EngramError:
    """The domain error for a failed call to the shard at ``address``."""
    return dependency_error("shard", address, error,
                            credential_hint="ENGRAM_COMPACTOR_SERVICE_TOKEN_FILE")


class ShardCompactionGateway:
    """Implements :class:`~services.compactor.service.MemoryCompactionPort` against a shard."""

    def __init__(self, address: str, token: str, timeout: float = 60.0,
                 tls: TlsFiles | None = None) -> None:
        self.address = address
        files = tls or TlsFiles()
        self._client = ShardClient(address, token, timeout=timeout, **files)

    def compact(self, fleet_id: str, importance_below: float, older_than_days: float,
                dry_run: bool) -> CompactionOutcome:
        try:
            reply = self._client.compact(fleet_id, importance_below=importance_below,
                                         older_than_days=older_than_days, dry_run=dry_run)
        except EngramRpcError as error:
            raise shard_error(self.address, error) from None
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
        try:
            return self._client.apply_retention(fleet_id, older_than_days, dry_run)
        except EngramRpcError as error:
            raise shard_error(self.address, error) from None

    def close(self) -> None:
        self._client.close()
