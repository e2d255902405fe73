"""What each target keeps waiting in the store, for the quotas of the ingress.

The per-target counts the scripts keep (the targets HASH in _lib.lua), summed over shards, and
which delay-ids the id index names as waiting."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import cast

import redis

from bridge.store.calls import candidates_argv
from bridge.store.keys import Keys, Shard, text
from bridge.store.redis_errors import as_store_error
from bridge.store.scripts import CANDIDATES, Scripts


class Targets:
    """Per-target counts and id lookups over many shards, a round trip each."""

    def __init__(self, client: redis.Redis, keys: Keys, scripts: Scripts) -> None:
        self.client = client
        self.keys = keys
        self.scripts = scripts

    def waiting_by_target(self, shards: Sequence[Shard]) -> Counter[str]:
        """How many records wait whole for each target topic in ``shards`` (their targets HASH:
        not in flight, not references), summed."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hgetall(self.keys.of(shard).targets)
            replies = cast(list[dict[bytes, bytes]], pipe.execute())
        total: Counter[str] = Counter()
        for counts in replies:
            for target, n in counts.items():
                total[text(target)] += int(n)
        return total

    def ids_waiting(self, shards: Sequence[Shard], delay_ids: Sequence[str]) -> set[str]:
        """Which of the caller-given ``delay_ids`` the id index of some shard of ``shards`` (all
        of one delay topic) names for a record still pending: one call per shard, unconfirmed
        (the index keeps a 40-bit hash of each id)."""
        if not shards or not delay_ids:
            return set()
        topic = shards[0].topic
        argv = candidates_argv(topic, delay_ids)
        calls = [(CANDIDATES.keys(self.keys.of(s)), argv) for s in shards]
        found: set[str] = set()
        for reply in self.scripts.call(CANDIDATES, calls):
            found.update(i for i, hits in zip(delay_ids, reply.found, strict=True) if hits)
        return found
