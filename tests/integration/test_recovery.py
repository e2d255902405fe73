"""Redis losing data: the commit names the lowest pending record, so the bridge rebuilds."""

from __future__ import annotations

import collections
import logging
import signal
import time

import pytest
import redis
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from bridge.errors import StoreError
from bridge.message import H_AFTER, H_TARGET_TOPIC, Headers
from bridge.positions import rebuild_point
from bridge.store import AckBatch, Shard, Store, offset_of
from bridge.topics import check_retention
from testbed.harness import Bridge, Collector, Setup, produce_all, wipe
from tests.conftest import Services, TopicFactory, holds_within, wait_for

pytestmark = pytest.mark.integration


def due_in(setup: Setup, count: int, delay_ms: int, tag: str) -> list[int]:
    records: list[tuple[bytes | None, bytes, Headers]] = [
        (
            None,
            f"{tag}-{i}".encode(),
            [(H_TARGET_TOPIC, setup.targets[0].encode()), (H_AFTER, f"{delay_ms}ms".encode())],
        )
        for i in range(count)
    ]
    return [offset for _, offset in produce_all(setup.services.bootstrap, setup.delay, records)]


def committed(setup: Setup, partition: int = 0) -> tuple[int, int]:
    """The group's committed offset of a partition, as Kafka's lag tools read it, and the rebuild
    point the bridge committed with it."""
    consumer = Consumer(
        {"bootstrap.servers": setup.services.bootstrap, "group.id": f"bridge-{setup.unique}"}
    )
    try:
        [tp] = consumer.committed([TopicPartition(setup.delay, partition)], timeout=10)
        return int(tp.offset), rebuild_point(tp)
    finally:
        consumer.close()


def values_delivered(collector: Collector, setup: Setup) -> collections.Counter[bytes]:
    return collections.Counter(r.value or b"" for r in collector.of(setup.targets[0]))


def delivered_once(setup: Setup, count: int, what: str) -> collections.Counter[bytes]:
    """Collect until ``count`` records arrived, a second more for duplicates; deliveries per value."""
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= count, 60, what)
        collector.poll(1.0)
    finally:
        collector.close()
    return values_delivered(collector, setup)


def rebuilds(bridge: Bridge, setup: Setup) -> float:
    _, body = bridge.get("/metrics")
    topic = f'delay_topic="{setup.delay}"'
    return sum(
        float(x.split()[-1])
        for x in body.splitlines()
        if x.startswith("delay_bridge_rebuilds_total{") and topic in x
    )


def test_the_committed_offset_follows_ingestion_and_names_the_lowest_pending_record(
    one: Setup, bridges: list[Bridge]
) -> None:
    """Kafka's consumer-group lag (log end - committed offset: kafka-consumer-groups, Burrow, a
    lag exporter) is the ingest lag, 0 once all is stored, not every record still waiting; the
    lowest pending record, where a rebuild starts, rides in the commit's metadata — and follows
    the deliveries when nothing new is read (the committed offset stays: librdkafka commits a
    stored offset only when it differs from the committed one, whatever its metadata)."""
    due_in(one, 20, 8_000, "soon")  # offsets 0..19
    due_in(one, 1, 3_600_000, "later")  # offset 20, an hour away
    due_in(one, 10, 8_000, "soon2")  # offsets 21..30
    bridges.append(one.bridge().start())
    collector = one.collector()
    try:
        # Everything read and stored, nothing delivered yet: the rebuild point is the first.
        wait_for(lambda: committed(one) == (31, 0), 8, "committed offset 31, rebuild from 0")
        collector.until(lambda rs: len(rs) == 30, 60, "the 30 due records")
        # Everything up to offset 30 is in Redis, but offset 20 is still pending: the commit
        # says so, and a Redis that lost its data is rebuilt from there.
        last: list[tuple[int, int]] = []

        def moved_on() -> bool:
            last.append(committed(one))
            return last[-1] == (31, 20)

        assert holds_within(moved_on, 30), f"committed {last[-1]}, not 31 with a rebuild from 20"
    finally:
        collector.close()
    admin = AdminClient({"bootstrap.servers": one.services.bootstrap})
    [group] = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(f"bridge-{one.unique}")]
    ).values()
    offsets = {tp.partition: tp.offset for tp in group.result().topic_partitions}
    assert offsets[0] == 31  # what a lag exporter reads: a lag of 0 with one record waiting


def test_redis_wiped_while_running_is_rebuilt_from_the_delay_topic(
    one: Setup, bridges: list[Bridge]
) -> None:
    bridge = one.bridge().start()
    bridges.append(bridge)
    collector = one.collector()
    try:
        due_in(one, 50, 0, "early")  # offsets 0..49, delivered at once
        collector.until(lambda rs: len(rs) == 50, 60, "the early records")
        due_in(one, 100, 8_000, "late")  # offsets 50..149, pending
        wait_for(lambda: committed(one) == (150, 50), 30, "rebuild from 50 (lowest pending)")
        assert wipe(one) > 0
        collector.until(lambda rs: len(rs) >= 150, 60, "every record after the rebuild")
        collector.poll(1.0)
        assert "redis lost the state" in bridge.output()
        assert rebuilds(bridge, one) == 1
    finally:
        collector.close()
    counts = values_delivered(collector, one)
    assert len(counts) == 150 and max(counts.values()) == 1, "each record exactly once"


def test_redis_wiped_while_stopped_is_rebuilt_at_start(one: Setup, bridges: list[Bridge]) -> None:
    first = one.bridge("first").start()
    bridges.append(first)
    due_in(one, 30, 10_000, "pending")
    wait_for(lambda: committed(one) == (30, 0), 30, "committed offset 30, rebuild from 0")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    assert wipe(one) > 0
    bridges.append(one.bridge("second").start())
    counts = delivered_once(one, 30, "every record after the restart")
    assert len(counts) == 30 and max(counts.values()) == 1


def test_lost_writes_are_read_again(one: Setup, bridges: list[Bridge]) -> None:
    """A Redis restarted from an AOF missing its last second: the watermark went back."""
    bridge = one.bridge().start()
    bridges.append(bridge)
    due_in(one, 20, 8_000, "pending")  # offsets 0..19
    client = redis.Redis.from_url(one.services.redis_url)
    store = Store(client, f"test-{one.unique}")
    shard = Shard(one.delay, 0)
    wait_for(lambda: store.inventory.watermarks([shard]) == {shard: 19}, 30, "all 20 stored")
    keys = store.keys(shard)
    lost = [m for m in client.zrange(keys.due, 0, -1) if offset_of(m) >= 10]  # type: ignore[union-attr]
    assert len(lost) == 10
    client.hset(keys.meta, "ingested", "9")
    client.zrem(keys.due, *lost)
    store.ack(
        {shard: AckBatch(members=lost)}
    )  # clears their pending bits: the lost writes had set them
    client.close()
    counts = delivered_once(one, 20, "every record after the re-read")
    assert "redis lost writes" in bridge.output()
    assert len(counts) == 20 and max(counts.values()) == 1


def test_retention_shorter_than_max_delay_is_reported(
    services: Services, topics: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    short = topics("short", config={"retention.ms": "60000"})
    forever = topics("forever", config={"retention.ms": "-1"})
    admin = {"bootstrap.servers": services.bootstrap}
    with caplog.at_level(logging.WARNING, logger="bridge.topics"):
        assert check_retention(admin, [short, forever], max_delay_ms=3_600_000) == 1
    assert f"delay topic {short} keeps records for retention.ms=60000 (1m)" in caplog.text
    assert forever not in caplog.text
    assert check_retention(admin, [short], max_delay_ms=60_000) == 0
    compacted = topics("compacted", config={"cleanup.policy": "compact"})
    assert check_retention(admin, [compacted], 60_000, key_is_id={compacted}) == 0  # etf1's
    assert check_retention(admin, [compacted], 60_000) == 1
    started = time.monotonic()
    unreachable = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}
    assert check_retention(unreachable, [short], 60_000) == 0
    assert "could not read the delay topics' retention" in caplog.text
    assert time.monotonic() - started < 30


def test_an_evicting_redis_is_reported(redis_client: redis.Redis, unique: str) -> None:
    store = Store(redis_client, f"test-{unique}")
    before = store.eviction_policy()
    assert before is not None
    try:
        redis_client.config_set("maxmemory-policy", "allkeys-lru")
        assert store.eviction_policy() == "allkeys-lru"
    finally:
        redis_client.config_set("maxmemory-policy", before)
    assert store.eviction_policy() == before
    unreachable = Store(redis.Redis(port=1, socket_connect_timeout=1), "x")
    with pytest.raises(StoreError, match="redis unreachable"):  # said once at start-up
        unreachable.eviction_policy()
