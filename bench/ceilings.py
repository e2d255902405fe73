"""The bare store: the store's scripts driven in a tight loop, with no Kafka.

The records are built once up front (parsing is the ingress's work, not the store's); the loop
adds them in the ingress's batches — one pipelined call over the shards a batch spans — then
claims and acknowledges them in the egress's batches until none is left. The rates are what Redis
and the client library allow the bridge at most (the bare pipe, :mod:`bench.pipe`, is the other
ceiling).
"""

from __future__ import annotations

import time
from collections import defaultdict

from bridge.config import Config
from bridge.message import H_AFTER, H_TARGET_TOPIC, Headers, Scheduled, origin
from bridge.store import AckBatch, Shard, Store
from testbed.run import PARTITIONS
from testbed.workload import now_ms, value_of

LEASE_MS = 30_000


def bare_store(
    store: Store, config: Config, *, topic: str, count: int, value_size: int, target: str
) -> dict[str, float]:
    """Add ``count`` records due now to a scratch shard set, then claim and ack them all, in the
    batch sizes ``config`` gives the bridge."""
    shards = [Shard(topic, p) for p in range(PARTITIONS)]
    due = now_ms()
    headers: Headers = [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"0ms")]
    records = [
        Scheduled(
            offset=i // PARTITIONS,
            due_ms=due,
            target=target,
            key=b"k%d" % (i % 997),
            value=value_of(i, value_size),
            headers=headers,
            delay_id=origin(topic, i % PARTITIONS, i // PARTITIONS),
        )
        for i in range(count)
    ]
    in_batch = config.ingress.batch_size
    marks: dict[Shard, int] = {}
    started = time.perf_counter()
    for start in range(0, count, in_batch):
        batches: dict[Shard, tuple[int, list[Scheduled]]] = {}
        for i in range(start, min(count, start + in_batch)):
            shard = shards[i % PARTITIONS]
            batches.setdefault(shard, (0, []))[1].append(records[i])
        batches = {s: (recs[-1].offset, recs) for s, (_, recs) in batches.items()}
        store.add(batches, dict(marks))
        marks.update({s: high for s, (high, _) in batches.items()})
    added = time.perf_counter()
    # The egress claims at most 2 x batch_size in flight, split over the shards it owns.
    per_shard = max(1, 2 * config.egress.batch_size // PARTITIONS)
    left = count
    while left:
        claimed = store.claim(shards, per_shard, LEASE_MS)
        if not claimed:
            raise RuntimeError(f"bare store: {left} records not claimable")
        acks: dict[Shard, AckBatch] = defaultdict(AckBatch)
        for item in claimed:
            acks[item.shard].members.append(item.member)
        left -= store.ack(acks)
    done = time.perf_counter()
    for shard in shards:
        store.client.delete(*store.keys(shard).all())
    return {
        "bare_store_add_per_s": count / (added - started),
        "bare_store_claim_ack_per_s": count / (done - added),
        "bare_store_per_s": count / (done - started),
    }
