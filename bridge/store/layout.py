"""Earlier layouts and incarnations: keys moved from earlier builds' names, shards bound to topics.

Shards written in the earlier layout (``…:due``/``…:inflight`` of offsets beside a ``…:records``
HASH) are moved into today's by :meth:`Layout.upgrade` before the ingress computes their low
offset or the egress claims from them; keys under the names before every key started with the
prefix are moved by :meth:`Layout.relocate`; :meth:`Layout.bind` retires the records of a topic
that was deleted and created again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

import redis
from redis.cluster import RedisCluster

from bridge.errors import StoreError
from bridge.store.keys import Keys, Shard, text
from bridge.store.redis_errors import as_store_error
from bridge.store.results import Bound
from bridge.store.scripts import Call, Scripts

logger = logging.getLogger(__name__)

# Every key a shard may have, and how relocate.lua merges two copies of it (the first three are
# all a retired incarnation has).
RELOCATED = (("schedule", "zset"), ("leases", "zset"), ("claimed", "hash"), ("meta", "meta"),
              ("low", "zset"), ("pending", "bitmaps"), ("retired", "set"), ("due", "zset"),
              ("inflight", "zset"), ("records", "hash"))  # fmt: skip


class Layout:
    """Moves shards between key names, layouts and incarnations of their topic."""

    def __init__(self, client: redis.Redis, keys: Keys, scripts: Scripts) -> None:
        self.client = client
        self.keys = keys
        self.scripts = scripts
        self._relocation_denied = False
        self._labels: dict[Shard, str] = {}  # retires asked for and not answered yet

    def relocate(self, shards: Sequence[Shard]) -> int:
        """Move the shards' keys from the names before every key started with the prefix (see
        relocate.lua); returns how many keys moved. A no-op on Redis Cluster, where those builds
        did not run."""
        if isinstance(self.client, RedisCluster) or not shards or self._relocation_denied:
            return 0
        try:
            with as_store_error():
                pipe = self.client.pipeline(transaction=False)
                for shard in shards:
                    pipe.smembers(self.keys.names(shard, ("retired",), before_prefix=True)[0])
                labels = pipe.execute()
        except StoreError as exc:
            if not isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
                raise
            # A least-privilege user limited to "~<prefix>:*" sees no older names, and needs not.
            logger.info("not looking for keys under the names of earlier builds: %s", exc)
            self._relocation_denied = True
            return 0
        calls: list[Call] = []
        for shard, retired in zip(shards, labels, strict=True):
            keys: list[str] = []
            kinds: list[str] = []
            for incarnation in ["", *(text(label) for label in retired)]:
                one = Shard(shard.topic, shard.partition, incarnation)
                names = RELOCATED if not incarnation else RELOCATED[:3]
                olds = self.keys.names(one, [n for n, _ in names], before_prefix=True)
                news = self.keys.names(one, [n for n, _ in names])
                for (_, kind), old, new in zip(names, olds, news, strict=True):
                    keys += [old, new]
                    kinds.append(kind)
            calls.append(("relocate", keys, kinds))
        return sum(int(n) for n in self.scripts.run(calls))

    def upgrade(self, shards: Sequence[Shard], batch: int = 1000) -> int:
        """Move the shards' records from the earlier layout into this one, ``batch`` records per
        shard and round trip, until none is left. Returns how many moved; a shard with nothing
        to move costs one script call that finds the old keys empty."""
        moved, todo = 0, list(shards)
        while todo:
            calls: list[Call] = []
            for shard in todo:
                old, k = self.keys.legacy(shard), self.keys.of(shard)
                keys = [old.due, old.inflight, old.records, k.due, k.inflight, k.claimed, k.low,
                        k.pending]  # fmt: skip
                calls.append(("upgrade", keys, [batch]))
            replies = self.scripts.run(calls)
            moved += sum(int(n) for n, _ in replies)
            todo = [s for s, (_, left) in zip(todo, replies, strict=True) if int(left)]
        return moved

    def bind(
        self, topic_ids: Mapping[Shard, str], force: Sequence[Shard] = ()
    ) -> dict[Shard, Bound]:
        """Bind each shard to its topic's current incarnation (Kafka's topic id).

        A shard bound to another topic id — its topic was deleted and created again — or named in
        ``force`` (its offsets went back) has its records moved to a retired shard, which the
        mover drains, and starts empty, to be read from the beginning of the log.
        """
        shards = list(topic_ids)
        # A label is kept until its shard's reply arrives: asked again, a retire that ran but
        # whose reply was lost is answered as it was (incarnation.lua), not taken for done.
        labels = {s: self._labels.setdefault(s, uuid.uuid4().hex[:12]) for s in shards}
        calls: list[Call] = []
        for shard in shards:
            k = self.keys.of(shard)
            old = self.keys.of(Shard(shard.topic, shard.partition, labels[shard]))
            labelled = self.keys.retired_set(shard)
            keys = [k.due, k.inflight, k.claimed, k.meta, k.low, k.pending, labelled, old.due,
                    old.inflight, old.claimed, k.ids, k.refs, k.refs_due, old.refs,
                    old.refs_due, k.waits, old.waits, old.pending]  # fmt: skip
            args = [topic_ids[shard], labels[shard], "1" if shard in force else "0"]
            calls.append(("incarnation", keys, args))
        out = {}
        for shard, reply in zip(shards, self.scripts.run(calls) if calls else [], strict=True):
            stored = text(reply[1])
            if int(reply[0]) == 0:
                out[shard] = Bound(False, stored)
                continue
            moved, mark = int(reply[2]), int(reply[3])
            retired = Shard(shard.topic, shard.partition, labels[shard]) if moved else None
            out[shard] = Bound(True, stored, moved, None if mark < 0 else mark, retired)
        for shard in shards:
            del self._labels[shard]
        return out

    def retired(self, shards: Sequence[Shard]) -> set[Shard]:
        """The retired incarnations of ``shards`` that still hold records."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.smembers(self.keys.retired_set(shard))
            replies = pipe.execute()
        return {Shard(s.topic, s.partition, text(label))
                for s, labels in zip(shards, replies, strict=True) for label in labels}  # fmt: skip

    def forget_retired(self, shard: Shard) -> bool:
        """Drop a retired incarnation with nothing left in it; returns whether it was dropped."""
        k = self.keys.of(shard)
        keys = [self.keys.retired_set(shard), k.due, k.inflight, k.claimed, k.refs, k.refs_due,
                k.waits, k.pending]  # fmt: skip
        return bool(int(self.scripts.run([("retired", keys, [shard.incarnation])])[0]))
