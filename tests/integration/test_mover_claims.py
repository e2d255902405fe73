"""The mover's claims on the real Redis and Kafka, with explicit times (no sleeping)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from bridge.egress import Egress, Pending
from bridge.message import Scheduled, origin
from bridge.metrics import Metrics
from bridge.store import Claims, Shard, Store
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration


class CountingStore(Store):
    """The store, noting the shards of every claim call."""

    calls: list[list[Shard]]

    def claim(self, shards: Sequence[Shard], *args: Any, **kwargs: Any) -> Claims:
        self.calls.append(list(shards))
        return super().claim(shards, *args, **kwargs)


class WatchedEgress(Egress):
    """The mover, noting when (by the time the test passes) each record is produced."""

    now_ms = 0
    early: list[tuple[int, int]]

    def _send(self, ident: tuple[Shard, bytes], pending: Pending) -> None:
        if pending.claimed.record.due_ms > self.now_ms:
            self.early.append((pending.claimed.record.due_ms, self.now_ms))
        super()._send(ident, pending)


def test_shards_whose_claims_come_within_half_a_window_are_claimed_in_one_call(
    services: Services, topics: TopicFactory, redis_client: redis.Redis, unique: str
) -> None:
    # Three partitions, records falling due on each every 10 ms for a second, claimed up to
    # 100 ms ahead. The third partition is assigned 20 ms after the others, so its claims come
    # 20 ms after theirs; once they are within half a window of each other, one call serves all
    # three (before: one call for the first two, another for the third, every 50 ms).
    target = topics("out", 3)
    store = CountingStore(redis_client, f"test-{unique}")
    store.calls = []
    shards = [Shard("delay", p) for p in range(3)]
    t0 = store.time_ms()
    for p, shard in enumerate(shards):
        records = [Scheduled(o, t0 + 10 * o + 3 * p, target, b"k", b"v", [], origin("delay", p, o))
                   for o in range(100)]  # fmt: skip
        store.add({shard: (99, records)})
    producer = Producer({"bootstrap.servers": services.bootstrap, "linger.ms": 1})
    egress = WatchedEgress(producer, store, Metrics(CollectorRegistry()), dead_letter="dlq",
                           batch_size=500, lease_ms=30_000, max_attempts=3, tick_ms=10,
                           ahead_ms=100)  # fmt: skip
    egress.early = []
    egress.add_shards(set(shards[:2]))
    claimed = 0
    for now in range(t0, t0 + 1100, 5):
        if now == t0 + 20:
            egress.add_shards({shards[2]})
        egress.now_ms = now
        claimed += egress.step(now_ms=now)
    assert claimed == 300
    assert egress.early == [], "records produced before their due time"
    joint = next((i for i, call in enumerate(store.calls) if len(call) == 3), None)
    assert joint is not None, f"no call claimed from all three: {store.calls}"
    assert all(len(call) == 3 for call in store.calls[joint:]), store.calls
    # About a call every half window over the second (claims ahead reach 100 ms past its end).
    assert len(store.calls) <= 1000 // 50 + 3, store.calls
    assert producer.flush(10) == 0


def test_deliveries_of_a_retired_incarnation_leave_the_new_records_at_their_offsets(
    services: Services, topics: TopicFactory, redis_client: redis.Redis, unique: str
) -> None:
    # The delay topic is recreated while the mover has its offset 0 in flight. The new
    # incarnation's offset 0 is far out (a reference); its offset 1 is due now and delivered by
    # the same mover. The old record's delivery report, applied after the retire, must not touch
    # the new offset 0 (with its pending bit clear, the reference would never be read back).
    target = topics("out", 1)
    store = Store(redis_client, f"test-{unique}")
    shard = Shard("delay", 0)
    store.bind({shard: "id-1"})
    t0 = store.time_ms()
    store.add({shard: (0, [Scheduled(0, t0, target, b"k", b"old", [], origin("delay", 0, 0))])})
    producer = Producer({"bootstrap.servers": services.bootstrap, "linger.ms": 1})
    egress = Egress(producer, store, Metrics(CollectorRegistry()), dead_letter="dlq",
                    batch_size=10, lease_ms=30_000, max_attempts=3)  # fmt: skip
    egress.add_shards({shard})
    assert egress.step() == 1  # offset 0 of the old incarnation produced, not acknowledged
    retired = store.bind({shard: "id-2"})[shard].retired
    assert retired is not None
    new = [Scheduled(0, t0 + 3_600_000, target, b"k", b"far", [], origin("delay", 0, 0)),
           Scheduled(1, t0, target, b"k", b"now", [], origin("delay", 0, 1))]  # fmt: skip
    store.add({shard: (1, new)}, refer_after_ms=t0 + 60_000)
    egress.notify({shard: (-1, t0, -1)})  # a normal record due at t0
    wait_for(
        lambda: egress.step() >= 0 and not store.inventory.is_pending(shard, 1),
        30,
        "the new offset 1 delivered and acknowledged",
    )
    egress.deliveries.ack(force=True)
    assert store.inventory.is_pending(shard, 0), "the new incarnation's offset 0 was acknowledged"
    assert store.references.counts([shard]) == {shard: 1}
    # The old record is still the retired incarnation's, in flight: delivered again later.
    assert store.backlog([retired]).inflight == 1
    assert producer.flush(10) == 0
