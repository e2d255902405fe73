"""Reads of the schedule registry add.lua keeps per shard (``…:schedules``).

Which recurring schedules are paused when their records are claimed, where each live one is, and
how many run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import redis

from bridge.store.keys import Keys, Shard
from bridge.store.redis_errors import as_store_error
from bridge.store.results import Claimed

PAUSED = b":p"  # the end of a registry entry of a paused schedule (add.lua)
# A schedule's field: "=" and its delay-id. The others are the counts ("#schedules", "#paused") and
# low.lua's "#cursor". The registry keeps the marker of a schedule a cancel (or a record with its
# id) ended this long (low.lua).
SCHEDULE = b"="
KEEP_ENDED_MS = 24 * 3600 * 1000


class Registry:
    """Reads of the schedule registry, a round trip each."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def mark_paused(self, claimed: Sequence[Claimed]) -> None:
        """Set :attr:`Claimed.paused` on the recurring schedules among ``claimed`` that their
        shard's registry says are paused (one HMGET a shard, pipelined; none without a schedule)."""
        by_shard: dict[Shard, list[Claimed]] = {}
        for c in claimed:
            if c.record.recurring:
                by_shard.setdefault(c.shard.base(), []).append(c)
        if not by_shard:
            return
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard, schedules in by_shard.items():
                fields = [cast(str, field_of(c.record.delay_id)) for c in schedules]
                pipe.hmget(self.keys.of(shard).schedules, fields)
            replies = cast(list[list[bytes | None]], pipe.execute())
        for schedules, entries in zip(by_shard.values(), replies, strict=True):
            for c, entry in zip(schedules, entries, strict=True):
                c.paused = (
                    entry is not None and entry.endswith(PAUSED) and not entry.startswith(b"-")
                )

    def live(self, shards: Sequence[Shard], delay_id: str) -> list[Shard]:
        """The ``shards`` (of one delay topic) whose registry has a live schedule ``delay_id``."""
        if not shards:
            return []
        field = cast(str, field_of(delay_id))
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hget(self.keys.of(shard).schedules, field)
            entries = cast(list[bytes | None], pipe.execute())
        return [s for s, e in zip(shards, entries, strict=True) if e and not e.startswith(b"-")]

    def at(self, shards: Sequence[Shard]) -> dict[Shard, dict[int, bool]]:
        """Each shard's live schedules: the offset of the record each is at -> whether it is
        paused."""
        return {s: dict(live.values()) for s, live in self._live(shards).items()}

    def running(self, shards: Sequence[Shard]) -> dict[Shard, dict[str, int]]:
        """Each shard's live schedules (running or paused): delay-id -> the offset of the record
        each is at."""
        return {s: {i: at for i, (at, _) in live.items()} for s, live in self._live(shards).items()}

    def _live(self, shards: Sequence[Shard]) -> dict[Shard, dict[str, tuple[int, bool]]]:
        """Each shard's live schedules: delay-id -> (the offset of its record, paused)."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hgetall(self.keys.of(shard).schedules)
            replies = cast(list[dict[bytes, bytes]], pipe.execute())
        return {
            s: {
                f[len(SCHEDULE) :].decode(errors="replace"): (
                    int(v.split(b":")[0]),
                    v.endswith(PAUSED),
                )
                for f, v in r.items()
                if f.startswith(SCHEDULE) and not v.startswith(b"-")
            }
            for s, r in zip(shards, replies, strict=True)
        }

    def counts(self, shards: Sequence[Shard]) -> tuple[int, int]:
        """The live schedules of ``shards``, and how many of them are paused (the registry's
        own counts)."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hmget(self.keys.of(shard).schedules, ["#schedules", "#paused"])
            replies = cast(list[list[bytes | None]], pipe.execute())
        live = sum(int(r[0] or 0) for r in replies)
        return live, sum(int(r[1] or 0) for r in replies)


def field_of(delay_id: str) -> bytes:
    """The registry's field of the schedule ``delay_id``."""
    return SCHEDULE + delay_id.encode()
