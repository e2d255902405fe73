"""Redis bytes per delay-id index entry, for the index's earlier layout and packed ones.

    python -m bench.id_index_layouts [--entries N] [--id-bytes B]

The id index (``…:ids``) mapped each caller-given delay-id to its record's offset, due ms and
record timestamp: one HASH field per id. The packed layouts put fixed-width entries (a few bytes
of the id's hash, then offset and due time: 17 bytes in the store now) into the values of a HASH
whose fields are bucket numbers, so Redis's per-field cost (its dict entry, two allocations) is
shared by a bucket's entries. For each layout, N entries go to one HASH under a unique key on the
local Redis (``DELAY_BRIDGE_REDIS__URL``, else scripts/services' port) and Redis's
``used_memory`` growth per entry is printed; the key is deleted after each.
"""

from __future__ import annotations

import argparse
import random
import struct
import uuid
from collections.abc import Callable
from typing import cast

import redis

from bench.local import local_redis

PIPELINE = 5_000
DUE_MS, STAMP_MS = 1_795_000_000_000, 1_794_000_000_000


def used(client: redis.Redis) -> int:
    client.memory_purge()
    return cast(dict[str, int], client.info("memory"))["used_memory"]


def per_entry(client: redis.Redis, entries: int, fill: Callable[[redis.Redis, str], None]) -> float:
    """Redis's used_memory growth per entry once ``fill`` wrote ``entries`` to a new HASH."""
    key = f"bench-ids-{uuid.uuid4().hex[:8]}"
    before = used(client)
    fill(client, key)
    grown = used(client) - before
    client.delete(key)  # at once: UNLINK frees in the background, under the next measurement
    return grown / entries


def by_id(entries: int, id_bytes: int) -> Callable[[redis.Redis, str], None]:
    """The earlier layout: the delay-id -> offset (8 bytes), ``<due ms>:<timestamp ms>``."""

    def fill(client: redis.Redis, key: str) -> None:
        pipe = client.pipeline(transaction=False)
        for i in range(entries):
            delay_id = f"order-{i}".rjust(id_bytes, "0")
            pipe.hset(
                key,
                mapping={delay_id: struct.pack(">Q", i) + f"{DUE_MS + i}:{STAMP_MS + i}".encode()},
            )
            if i % PIPELINE == PIPELINE - 1:
                pipe.execute()
        pipe.execute()

    return fill


def packed(entries: int, per_bucket: int, width: int) -> Callable[[redis.Redis, str], None]:
    """Entries of ``width`` bytes, ``per_bucket`` to a field on average (hashed at random)."""

    def fill(client: redis.Redis, key: str) -> None:
        rng = random.Random(1)
        buckets: dict[int, list[bytes]] = {}
        for _ in range(entries):
            buckets.setdefault(rng.randrange(entries // per_bucket), []).append(
                rng.randbytes(width)
            )
        pipe = client.pipeline(transaction=False)
        for n, (bucket, values) in enumerate(buckets.items()):
            pipe.hset(key, mapping={str(bucket): b"".join(values)})
            if n % PIPELINE == PIPELINE - 1:
                pipe.execute()
        pipe.execute()

    return fill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--id-bytes", type=int, default=31)
    args = parser.parse_args()
    client = local_redis()
    try:
        n = args.entries
        print(f"| layout | bytes per entry ({n:,} entries, {args.id_bytes}-byte ids) |")
        print("|---|---|")
        store = per_entry(client, n, by_id(n, args.id_bytes))
        print(f"| a field per delay-id (the earlier layout) | {store:.1f} |")
        for width in (17, 19):
            for k in (16, 32, 64, 128):
                got = per_entry(client, n, packed(n, k, width))
                print(f"| {width}-byte entries, {k} to a bucket | {got:.1f} |")
    finally:
        client.close()


if __name__ == "__main__":
    main()
