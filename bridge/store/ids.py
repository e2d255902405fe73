"""The id index's hash of a delay-id, and how a candidate it gives is confirmed.

The id index (``…:ids``, see the id index in _lib.lua) keeps no delay-id: an entry is a 5-byte
hash of (delay topic, delay-id), the record's offset (its low 6 bytes) and its due ms, 17 bytes
packed with others into a bucket field. Two ids may hash alike, so a match is a candidate only:
the scripts confirm a record held whole by the id its stored form carries; a reference (a
far-future record, its payload left in Kafka) is confirmed by reading it in the delay topic
(:data:`Confirm`), as are the records a cancel or replacement read in another partition names (its
timestamp decides too).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence

from bridge.message import Scheduled
from bridge.store.keys import Shard

# 40 bits: a lookup among n entries of a shard meets another id's hash n / 2^40 of the time (1 in
# 110,000 at ten million), and only then is a record read to tell them apart. A test lowers
# HASH_BITS to force collisions (every cancel and replacement must still reach exactly its own
# record); read at each call.
HASH_BYTES = 5  # ID_HASH in _lib.lua
HASH_BITS = 8 * HASH_BYTES
ENTRY_BYTES = HASH_BYTES + 6 + 6  # ID_ENTRY in _lib.lua: the hash, the offset's low 6 bytes, due

# For each (offset, due ms) of a shard's delay topic asked, the delay-id and timestamp of the
# record read there; an offset left out holds no record that can match (gone, or not a schedule).
Confirm = Callable[[Shard, Sequence[tuple[int, int]]], Mapping[int, tuple[str, int]]]
# For each offset of a shard's delay topic asked, the schedule read there, as the ingress parsed it:
# where the record a default delay-id names waits (its due time: a hint add.lua checks), its own
# delay-id and its timestamp; an offset left out holds no schedule (gone from the log, or not one).
Schedules = Callable[[Shard, Sequence[int]], Mapping[int, Scheduled]]
# Of the partitions asked, those whose log holds records, read in Kafka: one Redis holds no state
# of lost it (a partition with none never had any), so a cancel that found nothing waits for its
# owner to read it again.
Logged = Callable[[Collection[Shard]], Collection[Shard]]


# A record with its own delay-id is hashed where it is stored and again for each other partition
# of its topic it is looked for in (bridge.store.across), a batch apart at most: the hashes of
# the last few batches are kept (docs/bench/history.md, "A delay-id's ingest").
HASHES_KEPT = 4096


def id_hash(topic: str, delay_id: str) -> bytes:
    """The id index's hash of ``delay_id`` in the delay topic ``topic`` (HASH_BYTES bytes)."""
    return _hashed(topic, delay_id, HASH_BITS)


@functools.lru_cache(maxsize=HASHES_KEPT)
def _hashed(topic: str, delay_id: str, bits: int) -> bytes:
    digest = hashlib.blake2b(f"{topic}\0{delay_id}".encode(), digest_size=HASH_BYTES).digest()
    if bits >= 8 * HASH_BYTES:
        return digest
    kept = int.from_bytes(digest, "big") & ((1 << bits) - 1)
    return kept.to_bytes(HASH_BYTES, "big")


def unconfirmed(shard: Shard, asked: Sequence[tuple[int, int]]) -> Mapping[int, tuple[str, int]]:
    """The :data:`Confirm` of a store given none: a candidate that needs reading in Kafka is an
    error (the bridge's ingress always gives one; a test of the store alone gives its own)."""
    raise LookupError(f"{shard}: id index candidates {list(asked)} need reading in the delay topic")


def unlogged(shards: Collection[Shard]) -> Collection[Shard]:
    """The :data:`Logged` of a store given none (a test of the store alone): a partition Redis
    holds no state of is taken to have never had any."""
    return ()


def undated(shard: Shard, asked: Sequence[int]) -> Mapping[int, Scheduled]:
    """The :data:`Schedules` of a store given none: nothing read, so a default delay-id's record is
    looked for in Redis (:meth:`bridge.store.inventory.Inventory.wholes`)."""
    return {}


def read_index(fields: Mapping[bytes, bytes]) -> list[tuple[bytes, bytes, int]]:
    """The entries of an id index, as HGETALL gives it: (id hash, offset's 8 bytes, due ms)
    each, bucket by bucket (the state field "#" left out). For tests and tools."""
    out = []
    for field, bucket in fields.items():
        if field == b"#":
            continue
        for at in range(0, len(bucket), ENTRY_BYTES):
            entry = bucket[at : at + ENTRY_BYTES]
            hashed, offset, due = entry[:HASH_BYTES], entry[HASH_BYTES:-6], entry[-6:]
            out.append((hashed, b"\0\0" + offset, int.from_bytes(due, "big")))
    return out
