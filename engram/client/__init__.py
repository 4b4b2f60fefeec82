"""Engram Python SDK: one client per service, all raising ``EngramRpcError`` on failure.

    from engram.client import ClientSettings, ShardClient
    settings = ClientSettings()
    with ShardClient(settings.shard_addr, settings.resolve_token()) as shard:
        shard.add("Lesson learned: retries need idempotency keys", importance=0.8)
"""

from engram.client._channel import BaseClient, open_channel
from engram.client._errors import EngramRpcError
from engram.client._settings import ClientSettings, TlsFiles
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient
from engram.client.governance import GovernanceClient
from engram.client.shard import ShardClient, record_filter, record_input

__all__ = [
    "ArtifactsClient",
    "BaseClient",
    "ClientSettings",
    "CompactorClient",
    "EngramRpcError",
    "GovernanceClient",
    "ShardClient",
    "TlsFiles",
    "open_channel",
    "record_filter",
    "record_input",
]
