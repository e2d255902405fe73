"""Metric values, read with registry.get_sample_value, after real work on Kafka and Redis."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, KafkaError, TopicPartition
from prometheus_client import CollectorRegistry

from bridge.config import from_mapping
from bridge.message import H_AFTER, H_DELIVER_AT, H_TARGET_TOPIC, Priority, Scheduled
from bridge.metrics import Metrics, set_lag
from bridge.sampler import Sampler
from bridge.service import Service
from bridge.store import AckBatch, Shard, Store
from testbed.harness import bridge_env, produce_all
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    assert v is not None, f"{name}{labels} is not exported"
    return v


def overdue(registry: CollectorRegistry, priority: str | None = None) -> float:
    """delay_bridge_overdue_messages of one priority, or of all."""
    names = [priority] if priority else [p.label for p in Priority]
    return sum(value(registry, "delay_bridge_overdue_messages", priority=p) for p in names)


def test_backlog_gauges(redis_client: redis.Redis, unique: str) -> None:
    store = Store(redis_client, f"test-{unique}")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    a, b, not_owned = Shard("d", 0), Shard("d", 1), Shard("d", 2)

    def rec(offset: int, due: int) -> Scheduled:
        return Scheduled(offset, due, "t", None, b"v", [], str(offset))

    store.add({a: (2, [rec(0, T0 - 90_000), rec(1, T0 - 1), rec(2, T0 + 5)])})
    store.add({b: (1, [rec(0, T0 + 10), rec(1, T0 + 3_600_000)])})
    store.add({not_owned: (0, [rec(0, T0 - 999_000)])})
    store.claim([a], 1, 30_000, now_ms=T0)  # the 90 s old one goes in flight
    Sampler(store, metrics, lambda: {a, b}).sample_once(now_ms=T0)

    assert value(registry, "delay_bridge_scheduled_messages") == 3
    assert overdue(registry) == overdue(registry, "normal") == 2  # one waiting, one in flight
    assert value(registry, "delay_bridge_inflight_messages") == 1
    assert value(registry, "delay_bridge_oldest_overdue_seconds") == pytest.approx(0.001)
    assert value(registry, "delay_bridge_owned_partitions") == 2


def test_overdue_records_by_priority(redis_client: redis.Redis, unique: str) -> None:
    store = Store(redis_client, f"test-{unique}")
    registry = CollectorRegistry()
    shard = Shard("d", 0)
    store.add(
        {
            shard: (
                3,
                [
                    Scheduled(0, T0 - 10, "t", None, b"v", [], "0", priority=Priority.HIGH),
                    Scheduled(1, T0 - 10, "t", None, b"v", [], "1", priority=Priority.LOW),
                    Scheduled(2, T0 - 5, "t", None, b"v", [], "2", priority=Priority.LOW),
                    Scheduled(3, T0 + 5, "t", None, b"v", [], "3", priority=Priority.HIGH),
                ],
            )
        }
    )
    claimed = store.claim([shard], 1, 30_000, now_ms=T0)
    assert [c.record.priority for c in claimed] == [Priority.HIGH]  # the mover's, in flight

    def in_memory(now_ms: int) -> tuple[int, dict[Priority, int]]:  # as Egress.readings
        return 0, {Priority.HIGH: sum(1 for c in claimed if c.record.due_ms <= now_ms)}

    Sampler(store, Metrics(registry), lambda: {shard}, in_memory=in_memory).sample_once(now_ms=T0)
    assert (overdue(registry, "high"), overdue(registry, "normal"), overdue(registry, "low")) == (
        1,
        0,
        2,
    )
    assert value(registry, "delay_bridge_scheduled_messages") == 1


def test_records_claimed_ahead_are_in_flight_but_not_overdue(
    redis_client: redis.Redis, unique: str
) -> None:
    store = Store(redis_client, f"test-{unique}")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    shard = Shard("d", 0)
    records = [
        Scheduled(i, due, "t", None, b"v", [], f"d:0:{i}")  # default delay-ids
        for i, due in enumerate((T0 - 5, T0 + 40, T0 + 60))
    ]
    store.add({shard: (2, records)})
    claimed = store.claim([shard], 10, 30_000, now_ms=T0, ahead_ms=100)
    assert len(claimed) == 3  # one due, two claimed ahead

    def in_memory(now_ms: int) -> tuple[int, dict[Priority, int]]:  # as Egress.readings
        return sum(1 for c in claimed if c.record.due_ms > now_ms), {}  # what it holds back

    sampler = Sampler(store, metrics, lambda: {shard}, in_memory=in_memory)
    sampler.sample_once(now_ms=T0)
    assert value(registry, "delay_bridge_inflight_messages") == 3
    assert overdue(registry) == 1
    sampler.sample_once(now_ms=T0 + 50)
    assert overdue(registry) == 2


def test_lost_shards_and_records_stuck_in_flight_are_still_reported(
    redis_client: redis.Redis, unique: str
) -> None:
    """Kafka unreachable: the partitions are lost with the group session, and what was claimed
    before cannot be delivered. The gauges still say what is overdue, and how old it is."""
    store = Store(redis_client, f"test-{unique}")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    owned, lost = Shard("d", 0), Shard("d", 1)
    lease, ahead = 30_000, 100
    store.add(
        {
            lost: (
                2,
                [
                    Scheduled(i, due, "t", None, b"v", [], f"d:1:{i}")
                    for i, due in enumerate((T0, T0 + 1, T0 + 5000))
                ],
            )
        }
    )
    assert len(store.claim([lost], 2, lease, now_ms=T0 + 1)) == 2  # claimed, never delivered
    sampler = Sampler(store, metrics, lambda: {owned}, lost=lambda: {lost}, due_by_ms=lease - ahead)
    sampler.sample_once(now_ms=T0 + 20_000)
    assert overdue(registry) == 3  # one waiting, two in flight
    assert value(registry, "delay_bridge_inflight_messages") == 2
    # The waiting one is 15 s overdue; the ones in flight were due by their claim + ahead.
    assert value(registry, "delay_bridge_oldest_overdue_seconds") == pytest.approx(19.999 - 0.1)
    store.ack(
        {
            lost: AckBatch(
                members=[c.member for c in store.claim([lost], 2, lease, now_ms=T0 + 30_002)]
            )
        }
    )
    sampler.sample_once(now_ms=T0 + 30_003)  # the expired leases went out again, and landed
    assert value(registry, "delay_bridge_oldest_overdue_seconds") == pytest.approx(25.003)
    assert value(registry, "delay_bridge_owned_partitions") == 1
    Sampler(store, metrics, lambda: {owned}).sample_once(now_ms=T0 + 20_000)
    assert overdue(registry) == 0  # not ours: not reported


def test_ingest_lag_from_librdkafka_statistics(
    services: Services, topics: TopicFactory, unique: str
) -> None:
    topic = topics("lagging")
    produce_all(services.bootstrap, topic, [(None, b"x", [])] * 10)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    shard = Shard(topic, 0)
    positions: dict[Shard, int | None] = {shard: None}  # nothing in Redis yet: log start
    consumer = Consumer(
        {
            "bootstrap.servers": services.bootstrap,
            "group.id": f"lag-{unique}",
            "enable.auto.commit": False,
            "statistics.interval.ms": 200,
            "stats_cb": lambda js: set_lag(metrics, positions, json.loads(js)),
        }
    )

    def lag() -> float | None:
        consumer.consume(100, 0.1)
        return registry.get_sample_value(
            "delay_bridge_ingest_lag_messages", {"delay_topic": topic, "partition": "0"}
        )

    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        # No watermark known and no commit: everything from the log start is lag.
        wait_for(lambda: lag() == 10, 30, "lag of 10 counted from the log start")
        # Redis now holds offsets 0..9 (watermark 9). The committed offset plays no part: it is
        # the lowest pending record, which may be far behind.
        positions[shard] = 10
        produce_all(services.bootstrap, topic, [(None, b"y", [])] * 50)
        wait_for(lambda: lag() == 50, 30, "lag of 50 in the statistics")
        # one broker: the GroupCoordinator connection librdkafka also lists is not a second
        assert value(registry, "delay_bridge_kafka_brokers_up") == 1
        metrics.forget_partitions({shard})
        assert (
            registry.get_sample_value(
                "delay_bridge_ingest_lag_messages", {"delay_topic": topic, "partition": "0"}
            )
            is None
        )
    finally:
        consumer.close()


def test_counters_after_an_end_to_end_run(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path
) -> None:
    delay, target, dlq = topics("delay", 2), topics("out"), topics("dlq")
    env = bridge_env(
        services.bootstrap,
        services.redis_url,
        topics__delay=delay,
        topics__dead_letter=dlq,
        topics__journal=topics("journal"),
        kafka__group_id=f"g-{unique}",
        redis__key_prefix=f"test-{unique}",
    )
    config = from_mapping({}, env=env)
    registry = CollectorRegistry()
    service = Service(config, registry)
    # Series users alert on exist from start-up, at 0.
    assert value(registry, "delay_bridge_ingested_total", delay_topic=delay) == 0
    assert value(registry, "delay_bridge_dead_lettered_total", reason="bad-due-time") == 0
    assert value(registry, "delay_bridge_build_info", version=__import__("bridge").__version__) == 1

    runner = threading.Thread(target=service.run)
    runner.start()
    try:
        now = time.time_ns() // 1_000_000
        good = [
            (
                None,
                f"v{i}".encode(),
                [(H_TARGET_TOPIC, target.encode()), (H_AFTER, f"{i * 10}ms".encode())],
            )
            for i in range(40)
        ]
        past = [
            (
                None,
                b"p",
                [(H_TARGET_TOPIC, target.encode()), (H_DELIVER_AT, str(now - 3_600_000).encode())],
            )
        ]
        bad = [(None, b"b", [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"later")])] * 3
        produce_all(services.bootstrap, delay, good + past + bad)

        def delivered() -> float:
            return (
                registry.get_sample_value("delay_bridge_delivered_total", {"target_topic": target})
                or 0
            )

        wait_for(lambda: delivered() == 41, 60, "41 deliveries counted")
        wait_for(
            lambda: overdue(registry) == 0,
            10,
            "backlog gauge to drain",
        )
    finally:
        service.stop_event.set()
        runner.join(30)
    assert not runner.is_alive()
    assert value(registry, "delay_bridge_ingested_total", delay_topic=delay) == 41
    assert value(registry, "delay_bridge_dead_lettered_total", reason="bad-due-time") == 3
    assert value(registry, "delay_bridge_redelivered_total") == 0
    # Exported from start-up, at 0 here: no record of this run had a delay-id twice or a cancel.
    assert value(registry, "delay_bridge_replaced_total") == 0
    for result in ("cancelled", "not-found"):
        assert value(registry, "delay_bridge_cancelled_total", result=result) == 0
    assert value(registry, "delay_bridge_delivery_lateness_seconds_count", priority="normal") == 41
    # The record due an hour before it was produced counts from when the bridge stored it: the
    # lateness measures the bridge, not the producer (it once added its whole hour).
    assert (
        value(
            registry, "delay_bridge_delivery_lateness_seconds_bucket", priority="normal", le="+Inf"
        )
        == 41
    )
    assert (
        value(
            registry, "delay_bridge_delivery_lateness_seconds_bucket", priority="normal", le="30.0"
        )
        == 41
    )
    assert (
        value(registry, "delay_bridge_delivery_lateness_seconds_sum", priority="normal") < 41 * 30
    )
    # The bridge's own share: each record handed to the producer once, none counting the hour.
    assert value(registry, "delay_bridge_send_lateness_seconds_count") == 41
    assert value(registry, "delay_bridge_send_lateness_seconds_bucket", le="30.0") == 41
    assert value(registry, "delay_bridge_send_lateness_seconds_sum") <= value(
        registry, "delay_bridge_delivery_lateness_seconds_sum", priority="normal"
    )


def test_a_stuck_loop_turns_healthz_red(services: Services, unique: str) -> None:
    env = bridge_env(
        services.bootstrap,
        services.redis_url,
        kafka__group_id=f"g-{unique}",
        redis__key_prefix=f"test-{unique}",
    )
    service = Service(from_mapping({}, env=env), CollectorRegistry())
    assert service.health() == []
    service.egress.last_loop = time.monotonic() - 61  # the mover has not come round for a minute
    assert service.health() == ["egress loop silent for 61s"]
    service.egress.last_loop = time.monotonic()
    service.egress.sender.last_loop = time.monotonic() - 61  # nor the sender of held records
    assert service.health() == ["sender loop silent for 61s"]
    assert "consumer has not joined its group" in service.ready()


def test_a_fatal_producer_error_stops_the_bridge(services: Services, unique: str) -> None:
    """A fatal error leaves librdkafka's idempotent producer unusable: every delivery failed
    from then on and was retried forever, while /healthz stayed green. Kafka here has no
    authorizer or fault hook to make one (see the trust issue's note): the producer's own error
    callback is handed the error librdkafka would hand it."""
    env = bridge_env(
        services.bootstrap,
        services.redis_url,
        kafka__group_id=f"g-{unique}",
        redis__key_prefix=f"test-{unique}",
    )
    service = Service(from_mapping({}, env=env), CollectorRegistry())
    service._on_producer_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert service.health() == [] and not service.stop_event.is_set()
    service._on_producer_error(
        KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence desynchronised", fatal=True)
    )
    assert service.stop_event.is_set()
    (problem,) = service.health()
    assert "fatal producer error" in problem and "sequence desynchronised" in problem
