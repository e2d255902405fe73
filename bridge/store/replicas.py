"""What each running replica says it owns, for the watch on partitions no member owns.

One hash per consumer group, ``<prefix>:replicas:<group>`` (deployments sharing a Redis prefix
watch their own groups only): replica id -> when it last said (Redis's clock), whether its
consumer is in its group, and the delay partitions assigned to it. Each replica writes its own
field every few seconds and deletes it when it stops; a field not written for longer than a
group session is a replica gone (its partitions are another's by then) and is dropped by the
next read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import cast

import redis

from bridge.store.keys import Shard
from bridge.store.redis_errors import as_store_error


@dataclass(frozen=True)
class Replica:
    """A replica's last word: whether its consumer is in its group, and what it owns."""

    joined: bool
    owned: frozenset[Shard]


class Replicas:
    """The replicas' fields of ``<prefix>:replicas:<group>`` (raises StoreError if Redis
    fails)."""

    def __init__(
        self, client: redis.Redis, prefix: str, now_ms: Callable[[], int], group: str
    ) -> None:
        self.client = client
        self.key = f"{prefix}:replicas:{group}"
        self._now_ms = now_ms  # Redis's clock (Store.time_ms): one clock for every replica

    def say(self, replica: str, joined: bool, owned: Collection[Shard]) -> None:
        """Write what ``replica`` owns now."""
        with as_store_error():
            pairs = sorted([s.topic, s.partition] for s in owned)
            value = json.dumps({"at": self._now_ms(), "joined": joined, "owned": pairs})
            self.client.hset(self.key, replica, value)

    def forget(self, replica: str) -> None:
        """``replica`` stops: it owns nothing."""
        with as_store_error():
            self.client.hdel(self.key, replica)

    def alive(self, within_ms: int) -> dict[str, Replica]:
        """The replicas that said within ``within_ms``; the others' fields are deleted."""
        with as_store_error():
            now = self._now_ms()
            fields = cast(dict[bytes, bytes], self.client.hgetall(self.key))
            out: dict[str, Replica] = {}
            gone: list[str] = []
            for name, raw in fields.items():
                try:
                    value = json.loads(raw)
                    at, joined = int(value["at"]), bool(value["joined"])
                    owned = frozenset(Shard(t, int(p)) for t, p in value["owned"])
                except (ValueError, KeyError, TypeError):
                    at, joined, owned = 0, False, frozenset()  # not a replica's word: dropped
                if now - at > within_ms:
                    gone.append(name.decode())
                else:
                    out[name.decode()] = Replica(joined, owned)
            if gone:
                self.client.hdel(self.key, *gone)
        return out
