"""The earliest record timestamp among the cancels and replacements a shard keeps.

A cancel or a replacement that found nothing while another partition of its topic is not whole
in Redis is kept (its shard's ``withdrawing`` ZSET, see add.lua) until that partition's re-read
after a loss has ended (bridge.ingress.adds). The replica re-reading that partition must claim
nothing such a cancel may withdraw meanwhile — nothing due after its record timestamp — though
the cancel was read by another replica. So whoever keeps cancels in a shard writes the earliest
of their timestamps to the shard's ``kept`` HASH (field ``at``, epoch ms; a HASH for the
commands the bridge's ACL user has), and a re-reading replica reads it beside the shard's resume
point: the value counts only while the resume point stands at a kept entry (a value left by a
replica gone, or from before its cancels looked again, says nothing then); a shard that keeps
entries and has no value (written a moment after the add) leaves the reader where it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import redis

from bridge.store.inventory import RESUME_FIELDS, ResumePoint
from bridge.store.keys import Keys, Shard
from bridge.store.redis_errors import as_store_error


class Kept:
    """The shards' ``kept`` keys (raises StoreError if Redis fails)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def write(self, stamps: Mapping[Shard, int | None]) -> None:
        """Each shard's earliest kept timestamp (None: it keeps none now)."""
        if not stamps:
            return
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard, stamp in stamps.items():
                key = self.keys.kept(shard)
                if stamp is None:
                    pipe.delete(key)
                else:
                    pipe.hset(key, "at", str(stamp))
            pipe.execute()

    def read(self, shards: Sequence[Shard]) -> dict[Shard, int | None]:
        """Those of ``shards`` that keep cancels or replacements now (their resume point at or
        below their watermark), each with the earliest timestamp written for them (None:
        none)."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                keys = self.keys.of(shard)
                pipe.hmget(keys.meta, ["ingested", *RESUME_FIELDS])
                pipe.zrange(keys.withdrawing, 0, 0, withscores=True)
                pipe.hget(self.keys.kept(shard), "at")
            values = pipe.execute()
        keeping: dict[Shard, int | None] = {}
        for shard, fields, low, stamp in zip(
            shards, values[0::3], values[1::3], values[2::3], strict=True
        ):
            if fields[0] is None:
                continue  # no state: nothing kept
            point = ResumePoint.read(fields, low)
            if point.start <= point.mark:
                keeping[shard] = None if stamp is None else int(cast(bytes, stamp))
        return keeping
