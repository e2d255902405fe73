"""The Redis store: one shard per delay-topic partition, every read-then-write a Lua script."""

from bridge.store.api import Store
from bridge.store.keys import Shard, ShardKeys, glob_escape, member, offset_bytes, offset_of
from bridge.store.redis_errors import as_store_error
from bridge.store.references import Chunk
from bridge.store.results import Added, Backlog, Bound, Claimed, Claims, Lost, Lows

__all__ = [
    "Added",
    "Backlog",
    "Bound",
    "Chunk",
    "Claimed",
    "Claims",
    "Lost",
    "Lows",
    "Shard",
    "ShardKeys",
    "Store",
    "as_store_error",
    "glob_escape",
    "member",
    "offset_bytes",
    "offset_of",
]
