"""Engram Python SDK.

from engram.client import ClientSettings, ShardClient
settings = ClientSettings()
with ShardClient(settings.shard_addr, settings.resolve_token()) as shard:
    shard.add("Lesson learned: retries need idempotency keys", importance=0.8)
"""

from engram.client._channel import BaseClient, open_channel
from engram.client._errors import EngramRpcError
from engram.client._settings import ClientSettings
from engram.client.shard import ShardClient, record_input

__all__ = [
    "BaseClient",
    "ClientSettings",
    "EngramRpcError",
    "ShardClient",
    "open_channel",
    "record_input",
]
