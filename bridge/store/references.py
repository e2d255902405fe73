"""References: far-future records kept as offset and due time until they are read back.

A record due further out than ``store.payload_horizon`` when it is read costs Redis 16 bytes in a
chunk of its time bucket (see :mod:`bridge.store.keys` and add.lua) instead of its payload. The
read-back (:mod:`bridge.readback`) asks for the chunks whose bucket starts within
``store.fetch_ahead``, reads their records from the delay topic, and hands them back through
:meth:`References.promote`, which stores them as records the mover claims as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import redis

from bridge.store.calls import promote_argv
from bridge.store.keys import Keys, Shard, references_in, text
from bridge.store.redis_errors import as_store_error
from bridge.store.scripts import PROMOTE, Scripts


@dataclass(frozen=True)
class Chunk:
    """One chunk of a shard's references, as read: its field, its bucket's start and its bytes."""

    shard: Shard
    field: str
    start_ms: int
    data: bytes

    def references(self) -> list[tuple[int, int]]:
        """(offset, due ms) of each reference, in offset order."""
        return references_in(self.data)


class References:
    """The references of every shard: what is due to be read back, and promoting it."""

    def __init__(self, client: redis.Redis, keys: Keys, scripts: Scripts) -> None:
        self.client = client
        self.keys = keys
        self.scripts = scripts

    def due(self, shards: Sequence[Shard], until_ms: int, limit: int = 16) -> list[Chunk]:
        """Up to ``limit`` chunks per shard whose bucket starts by ``until_ms``, earliest bucket
        first (two round trips whatever the number of shards)."""
        if not shards:
            return []
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.zrangebyscore(
                    self.keys.of(shard).refs_due, "-inf", until_ms, 0, limit, withscores=True
                )
            listed = cast(list[list[tuple[bytes, float]]], pipe.execute())
            wanted = [
                (s, text(f), int(start))
                for s, fields in zip(shards, listed, strict=True)
                for f, start in fields
            ]
            if not wanted:
                return []
            pipe = self.client.pipeline(transaction=False)
            for shard, field, _ in wanted:
                pipe.hget(self.keys.of(shard).refs, field)
            data = cast(list[bytes | None], pipe.execute())
        chunks = [Chunk(s, f, start, d) for (s, f, start), d in zip(wanted, data, strict=True) if d]
        return sorted(chunks, key=lambda c: c.start_ms)

    def promote(self, chunk: Chunk, members: Sequence[tuple[int, bytes]]) -> int | None:
        """Store the records of ``chunk`` — (score, member) per reference, in its order — and drop
        the references read; None when the chunk changed since it was read (promoted by another
        caller, or renamed as it filled up): nothing was stored. Returns records stored (those
        not cancelled meanwhile)."""
        k = self.keys.of(chunk.shard)
        args = promote_argv(chunk.field, chunk.data, bool(chunk.shard.incarnation), members)
        [stored] = self.scripts.call(PROMOTE, [(PROMOTE.keys(k), args)])
        return stored

    def counts(self, shards: Sequence[Shard]) -> dict[Shard, int]:
        """References waiting per shard."""
        if not shards:
            return {}
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hget(self.keys.of(shard).refs, "count")
            values = pipe.execute()
        return {s: int(v or 0) for s, v in zip(shards, values, strict=True)}
