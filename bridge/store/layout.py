"""Incarnations: shards bound to their delay topic's current incarnation, and the retired ones.

:meth:`Layout.bind` retires the records of a topic that was deleted and created again (or whose
offsets went back) to a shard the mover drains; :meth:`Layout.forget_retired` drops one once
nothing is left in it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

import redis

from bridge.store.calls import incarnation_argv, retired_argv
from bridge.store.keys import Keys, Shard, text
from bridge.store.redis_errors import as_store_error
from bridge.store.results import Bound
from bridge.store.scripts import INCARNATION, RETIRED, Scripts

logger = logging.getLogger(__name__)


class Layout:
    """Binds shards to incarnations of their topic, and retires the earlier ones."""

    def __init__(self, client: redis.Redis, keys: Keys, scripts: Scripts) -> None:
        self.client = client
        self.keys = keys
        self.scripts = scripts
        self._labels: dict[Shard, str] = {}  # retires asked for and not answered yet

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
        calls = []
        for shard in shards:
            old = self.keys.of(Shard(shard.topic, shard.partition, labels[shard]))
            labelled = self.keys.retired_set(shard)
            keys = INCARNATION.keys(self.keys.of(shard), old=old, retired=labelled)
            args = incarnation_argv(topic_ids[shard], labels[shard], shard in force)
            calls.append((keys, args))
        out = {}
        for shard, r in zip(shards, self.scripts.call(INCARNATION, calls), strict=True):
            retired = Shard(shard.topic, shard.partition, labels[shard]) if r.records else None
            out[shard] = Bound(r.retired, r.stored_id, r.records, r.watermark, retired)
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
        return {
            Shard(s.topic, s.partition, text(label))
            for s, labels in zip(shards, replies, strict=True)
            for label in labels
        }

    def topic_ids(self, retired: Sequence[Shard]) -> dict[Shard, str]:
        """The topic id of each retired incarnation ("": not kept, retired before it was)."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in retired:
                pipe.hget(self.keys.of(shard).meta, "topic_id")
            replies = pipe.execute()
        return {s: text(i or b"") for s, i in zip(retired, replies, strict=True)}

    def forget_retired(self, shard: Shard) -> bool:
        """Drop a retired incarnation with nothing left in it; returns whether it was dropped."""
        keys = RETIRED.keys(self.keys.of(shard), retired=self.keys.retired_set(shard))
        return bool(sum(self.scripts.call(RETIRED, [(keys, retired_argv(shard.incarnation))])))
