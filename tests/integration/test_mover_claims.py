"""The mover's claims on the real Redis and Kafka, with explicit times (no sleeping)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar, cast

import pytest
import redis
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from bridge.config import EgressConfig
from bridge.egress import Egress, InFlight
from bridge.egress.settle import Deliveries
from bridge.message import Priority, Scheduled, origin
from bridge.metrics import Metrics
from bridge.store import Claims, Shard, Store
from testbed.harness import Collector
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration


class CountingStore(Store):
    """The store, noting the shards of every claim call."""

    calls: list[list[Shard]]

    def claim(self, shards: Sequence[Shard], *args: Any, **kwargs: Any) -> Claims:
        self.calls.append(list(shards))
        return super().claim(shards, *args, **kwargs)


class Watched(Deliveries):
    """Deliveries noting when (by the time the test passes) each record is produced, and its
    value."""

    now_ms = 0
    early: list[tuple[int, int]]
    produced: list[bytes]

    def produce(self, ident: tuple[Shard, bytes], inflight: InFlight) -> None:
        if inflight.claimed.record.due_ms > self.now_ms:
            self.early.append((inflight.claimed.record.due_ms, self.now_ms))
        self.produced.append(inflight.claimed.record.value or b"")
        super().produce(ident, inflight)


class WatchedEgress(Egress):
    deliveries_type = Watched


E = TypeVar("E", bound=Egress)


def egress_of(
    services: Services, store: Store, config: EgressConfig, kind: type[E]
) -> tuple[Producer, E]:
    """A producer on the test broker, and an egress of ``kind`` moving ``store``'s records
    through it."""
    producer = Producer({"bootstrap.servers": services.bootstrap, "linger.ms": 1})
    return producer, kind(producer, store, Metrics(CollectorRegistry()), config, dead_letter="dlq")


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
        records = [
            Scheduled(o, t0 + 10 * o + 3 * p, target, b"k", b"v", [], origin("delay", p, o))
            for o in range(100)
        ]
        store.add({shard: (99, records)})
    config = EgressConfig(batch_size=500, tick=10, send_tick=10, ahead=100)
    producer, egress = egress_of(services, store, config, WatchedEgress)
    watched = cast(Watched, egress.deliveries)
    watched.early, watched.produced = [], []
    egress.add_shards(set(shards[:2]))
    claimed = 0
    for now in range(t0, t0 + 1100, 5):
        if now == t0 + 20:
            egress.add_shards({shards[2]})
        watched.now_ms = now
        claimed += egress.step(now_ms=now)
    assert claimed == 300
    assert watched.early == [], "records produced before their due time"
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
    store.layout.bind({shard: "id-1"})
    t0 = store.time_ms()
    store.add({shard: (0, [Scheduled(0, t0, target, b"k", b"old", [], origin("delay", 0, 0))])})
    config = EgressConfig(batch_size=10, tick=0, send_tick=0, ahead=0)
    producer, egress = egress_of(services, store, config, Egress)
    egress.add_shards({shard})
    assert egress.step() == 1  # offset 0 of the old incarnation produced, not acknowledged
    retired = store.layout.bind({shard: "id-2"})[shard].retired
    assert retired is not None
    new = [
        Scheduled(0, t0 + 3_600_000, target, b"k", b"far", [], origin("delay", 0, 0)),
        Scheduled(1, t0, target, b"k", b"now", [], origin("delay", 0, 1)),
    ]
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


def test_acknowledgements_know_while_the_sender_holds_records_claimed_ahead(
    services: Services, topics: TopicFactory, redis_client: redis.Redis, unique: str
) -> None:
    # While records claimed ahead wait in memory, the next claim comes within the window, and
    # acknowledgements wait for it (plan.ack_waits): Deliveries counts what the sender holds.
    target = topics("out", 1)
    store = Store(redis_client, f"test-{unique}")
    shard = Shard("delay", 0)
    t0 = store.time_ms()
    later = Scheduled(1, t0 + 3_000, target, b"k", b"later", [], origin("delay", 0, 1))
    store.add(
        {shard: (1, [Scheduled(0, t0, target, b"k", b"now", [], origin("delay", 0, 0)), later])}
    )
    config = EgressConfig(batch_size=10, tick=0, send_tick=0, ahead=5_000)
    producer, egress = egress_of(services, store, config, Egress)
    assert egress.deliveries.holding() == 0
    egress.add_shards({shard})
    assert egress.step() >= 1
    assert len(egress.sender) == 1, "the later record is held, claimed ahead"
    assert egress.deliveries.holding() == 1
    egress.sender.release()
    assert producer.flush(10) == 0


class Stalling(Deliveries):
    """Deliveries whose sender thread stalls in the middle of producing a slice of held records
    (the GIL, a busy core) until the test lets it go on; notes the order records are produced in."""

    produced: list[bytes | None]
    stalled: threading.Event
    go_on: threading.Event

    def produce(self, ident: tuple[Shard, bytes], inflight: InFlight) -> None:
        if threading.current_thread().name == "sender" and not self.stalled.is_set():
            self.stalled.set()
            self.go_on.wait(30)
        self.produced.append(inflight.claimed.record.value)
        super().produce(ident, inflight)


class SlowSlice(Egress):
    deliveries_type = Stalling


def test_records_leave_in_the_order_they_were_claimed_whichever_thread_sends_them(
    services: Services, topics: TopicFactory, redis_client: redis.Redis, unique: str
) -> None:
    # High records claimed ahead wait in memory; at their due time the sender thread takes them
    # and, half-way through producing them, stalls. Meanwhile the mover claims the normal records
    # due at the same time and sends them itself: they must not overtake the high ones already
    # taken, which Kafka would then append after them.
    target = topics("out", 1)
    store = Store(redis_client, f"test-{unique}")
    shard = Shard("delay", 0)
    t0 = store.time_ms() + 60_000
    records = [
        Scheduled(
            o, t0, target, b"k", f"{p.label}-{o}".encode(), [], origin("delay", 0, o), priority=p
        )
        for o, p in enumerate([Priority.HIGH] * 5 + [Priority.NORMAL] * 5)
    ]
    store.add({shard: (9, records)})
    config = EgressConfig(batch_size=100, tick=10, send_tick=10, ahead=100)
    producer, egress = egress_of(services, store, config, SlowSlice)
    slow = cast(Stalling, egress.deliveries)
    slow.produced, slow.stalled, slow.go_on = [], threading.Event(), threading.Event()
    egress.add_shards({shard})
    egress.step(now_ms=t0 - 200)  # learns what is due when
    assert egress.step(now_ms=t0 - 20) == 5  # the high ones, a lead ahead: held until t0
    sender = threading.Thread(target=egress.sender.send_due, args=(t0,), name="sender")
    sender.start()
    assert slow.stalled.wait(30), "the sender thread never took the high records"
    mover = threading.Thread(target=egress.step, kwargs={"now_ms": t0 + 1}, name="mover")
    mover.start()
    mover.join(1.0)  # the mover's claim either waits for the stalled slice or runs past it
    slow.go_on.set()
    sender.join(30)
    mover.join(30)
    labels = [(v or b"").split(b"-")[0] for v in slow.produced]
    assert labels == [b"high"] * 5 + [b"normal"] * 5, slow.produced
    assert producer.flush(10) == 0
    collector = Collector(services.bootstrap, [target], f"check-{unique}")
    try:
        collector.until(lambda rs: len(rs) >= 10, 30, "every record delivered")
    finally:
        collector.close()
    by_offset = [r.value for r in sorted(collector.records, key=lambda r: r.offset)]
    assert by_offset == slow.produced


def test_one_claim_of_several_shards_sends_their_records_in_priority_order(
    services: Services, topics: TopicFactory, redis_client: redis.Redis, unique: str
) -> None:
    # Records due at one instant, the first claim made after it: nothing told the mover what was
    # due, so every lane comes in one call, each shard's in lane order. Sent shard after shard,
    # shard 0's low record went before shard 1's normal one (a busy machine's priority drain:
    # test_priority.py's cross-partition test failed so in CI).
    target = topics("out", 1)
    store = Store(redis_client, f"test-{unique}")
    t0 = store.time_ms() + 60_000
    mix = {Shard("delay", 0): [Priority.NORMAL, Priority.LOW], Shard("delay", 1): [Priority.NORMAL]}
    for shard, priorities in mix.items():
        records = [
            Scheduled(
                o,
                t0,
                target,
                b"k",
                f"{p.label}-{shard.partition}".encode(),
                [],
                origin("delay", shard.partition, o),
                priority=p,
            )
            for o, p in enumerate(priorities)
        ]
        store.add({shard: (len(records) - 1, records)})
    config = EgressConfig(batch_size=100, tick=10, send_tick=10, ahead=100)
    producer, egress = egress_of(services, store, config, WatchedEgress)
    watched = cast(Watched, egress.deliveries)
    watched.now_ms, watched.early, watched.produced = t0 + 1, [], []
    egress.add_shards(set(mix))
    assert egress.step(now_ms=t0 + 1) == 3  # one call: the shards' records side by side
    assert watched.produced == [b"normal-0", b"normal-1", b"low-0"] and not watched.early
    assert producer.flush(10) == 0


class SlowRedis(Store):
    """The store whose next claim, once ``slow`` is set, Redis answers half a second late."""

    slow: threading.Event

    def claim(self, *args: Any, **kwargs: Any) -> Claims:
        if self.slow.is_set():
            self.slow.clear()
            time.sleep(0.5)  # the fault: a slow round trip, not a wait for something
        return super().claim(*args, **kwargs)


def test_a_claim_redis_answers_late_is_logged_with_where_the_mover_s_turn_went(
    services: Services,
    topics: TopicFactory,
    redis_client: redis.Redis,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = topics("out", 1)
    store = SlowRedis(redis_client, f"test-{unique}")
    store.slow = threading.Event()
    shard = Shard("delay", 0)
    t0 = store.time_ms()
    store.add({shard: (0, [Scheduled(0, t0, target, b"k", b"v", [], origin("delay", 0, 0))])})
    config = EgressConfig(batch_size=100, tick=10, send_tick=10, ahead=100)
    producer, egress = egress_of(services, store, config, Egress)
    egress.add_shards({shard})
    store.slow.set()
    stop = threading.Event()
    mover = threading.Thread(target=egress.run, args=(stop,), name="mover")

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if "mover loop" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="bridge.turns"):
        mover.start()
        try:
            wait_for(lambda: bool(logged()), 30, "the slow turn logged")
        finally:
            stop.set()
            mover.join(30)
    [line] = logged()
    claiming = re.search(r"claiming from redis ([\d,]+) ms", line)
    assert claiming is not None, line
    assert int(claiming.group(1).replace(",", "")) >= 500, line
    assert egress.turns.slowest_s >= 0.5
    assert producer.flush(10) == 0
