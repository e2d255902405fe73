"""The Redis store: one shard per delay-topic partition, every read-then-write a Lua script."""

from bridge.store.across import Elsewhere, due_hint, not_whole, replaced_exactly
from bridge.store.api import Store
from bridge.store.calls import ON_TIME_WINDOW_MS, AckBatch
from bridge.store.flight import Named
from bridge.store.ids import Confirm, Logged, Schedules, id_hash, unconfirmed, undated, unlogged
from bridge.store.inventory import ResumePoint, due_counts
from bridge.store.keys import (
    REFERENCE_BYTES,
    PerLane,
    Shard,
    ShardKeys,
    default_id_offset,
    due_of,
    glob_escape,
    lane_firsts,
    lane_of,
    member,
    offset_bytes,
    offset_of,
    references_in,
    score,
    shard_names,
    stored_record,
)
from bridge.store.redis_errors import as_store_error
from bridge.store.references import Chunk
from bridge.store.replicas import Replica, Replicas
from bridge.store.results import Added, Backlog, Bound, Claimed, Claims, Lost, Lows, Withdrawn

__all__ = [
    "ON_TIME_WINDOW_MS",
    "REFERENCE_BYTES",
    "AckBatch",
    "Added",
    "Backlog",
    "Bound",
    "Chunk",
    "Claimed",
    "Claims",
    "Confirm",
    "Elsewhere",
    "Logged",
    "Lost",
    "Lows",
    "Named",
    "PerLane",
    "Replica",
    "Replicas",
    "ResumePoint",
    "Schedules",
    "Shard",
    "ShardKeys",
    "Store",
    "Withdrawn",
    "as_store_error",
    "default_id_offset",
    "due_counts",
    "due_hint",
    "due_of",
    "glob_escape",
    "id_hash",
    "lane_firsts",
    "lane_of",
    "member",
    "not_whole",
    "offset_bytes",
    "offset_of",
    "references_in",
    "replaced_exactly",
    "score",
    "shard_names",
    "stored_record",
    "unconfirmed",
    "undated",
    "unlogged",
]
