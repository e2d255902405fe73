"""Faults that stop delivery are never silent: /readyz names them, the log says it once, a metric
counts them — and nothing spins or floods while they last."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from bridge.client import cancel_headers, delay_headers
from bridge.config import from_mapping
from bridge.message import H_AFTER, H_TARGET_TOPIC, Headers
from bridge.service import Service
from testbed.harness import Bridge, Setup, bridge_env, metric, produce_all
from tests.conftest import Services, TopicFactory, wait_for
from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration


def valid(
    target: str, count: int, tag: str, after: str = "0ms"
) -> list[tuple[None, bytes, Headers]]:
    return [
        (
            None,
            f"{tag}-{i}".encode(),
            [(H_TARGET_TOPIC, target.encode()), (H_AFTER, after.encode())],
        )
        for i in range(count)
    ]


def test_a_missing_dlq_turns_readyz_red_until_it_is_created(
    setup: Setup, topics: TopicFactory, bridges: list[Bridge], admin: AdminClient
) -> None:
    admin.delete_topics([setup.dlq])[setup.dlq].result(timeout=30)
    bridge = setup.bridge().start()
    bridges.append(bridge)
    bad: Headers = [(H_AFTER, b"0ms")]  # no target: dead-lettered as missing-target
    records = [(None, b"bad", bad), *valid(setup.targets[0], 5, "good")]
    produce_all(setup.services.bootstrap, setup.delay, records)
    # /readyz is 503 while the bridge starts too (the consumer not in its group yet): wait for
    # the DLQ's own line, not for any 503.
    missing = f"DLQ topic {setup.dlq} is not usable: it does not exist"
    wait_for(lambda: missing in bridge.get("/readyz")[1], 30, "/readyz naming the missing DLQ")
    assert bridge.get("/readyz")[0] == 503
    wait_for(
        lambda: metric(bridge, "delay_bridge_dlq_produce_errors_total") > 0,
        60,
        "a counted DLQ produce failure",
    )
    assert "delay_bridge_ready 0.0" in bridge.get("/metrics")[1]
    topics.recreate(setup.dlq)  # created again: the record behind the bad one moves on
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 6, 90, "5 deliveries and 1 dead letter")
    finally:
        collector.close()
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "/readyz 200 once the DLQ exists")


def test_a_target_and_dlq_refusing_records_back_off_instead_of_spinning(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path, bridges: list[Bridge]
) -> None:
    small = {"max.message.bytes": "1000"}  # the target refuses the 2 kB records every time
    tiny = {"max.message.bytes": "100"}  # the DLQ refuses them even without their value
    setup = Setup(
        services,
        topics("delay"),
        [topics("out", config=small)],
        topics("dlq", config=tiny),
        unique,
        tmp_path,
        topics("journal"),
    )
    bridge = setup.bridge(egress__max_attempts="1").start()
    bridges.append(bridge)
    produce_all(
        services.bootstrap,
        setup.delay,
        [(None, b"x" * 2000, [(H_TARGET_TOPIC, setup.targets[0].encode()), (H_AFTER, b"0ms")])] * 3,
    )
    wait_for(lambda: "deliveries to " + setup.dlq in bridge.output(), 60, "a failing DLQ")
    status, body = bridge.get("/readyz")
    assert status == 503 and f"DLQ produce to {setup.dlq} failed" in body, body
    first = metric(bridge, "delay_bridge_redelivered_total")
    lines = len(bridge.output().splitlines())
    window = time.monotonic() + 8
    wait_for(lambda: time.monotonic() > window, 10, "an 8 s window")
    # Backing off from 0.5 s, doubling to 5 s, 3 records come round at most 5 times each in 8 s; a
    # mover retrying at once did so hundreds of times.
    assert metric(bridge, "delay_bridge_redelivered_total") - first <= 3 * 5
    new_lines = bridge.output().splitlines()[lines:]
    assert len(new_lines) <= 6, "\n".join(new_lines)
    assert metric(bridge, "delay_bridge_dlq_produce_errors_total") >= 3


def test_a_record_refused_for_a_while_is_retried_after_its_back_off_not_its_lease(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path, bridges: list[Bridge]
) -> None:
    """A record the target refuses goes to the DLQ; while the DLQ is missing its produce fails
    and the record is released with a back-off (at most 5 s). Once the DLQ exists it arrives
    within that back-off — not when its 120 s lease would have run out."""
    small = {"max.message.bytes": "1000"}
    setup = Setup(
        services,
        topics("delay"),
        [topics("out", config=small)],
        topics("dlq"),
        unique,
        tmp_path,
        topics("journal"),
    )
    topics.admin.delete_topics([setup.dlq])[setup.dlq].result(timeout=30)
    bridge = setup.bridge(egress__max_attempts="1", egress__lease="120s").start()
    bridges.append(bridge)
    produce_all(
        services.bootstrap,
        setup.delay,
        [(None, b"x" * 2000, [(H_TARGET_TOPIC, setup.targets[0].encode()), (H_AFTER, b"0ms")])],
    )
    wait_for(lambda: "deliveries to " + setup.dlq in bridge.output(), 60, "a failing DLQ")
    topics.recreate(setup.dlq)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(collector.of(setup.dlq)) >= 1, 30, "the dead letter")
    finally:
        collector.close()


def test_a_read_only_redis_turns_readyz_red_and_names_it(
    setup: Setup, scratch_redis: str, bridges: list[Bridge]
) -> None:
    bridge = setup.bridge(redis__url=scratch_redis).start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    client = redis.Redis.from_url(scratch_redis)
    client.replicaof("127.0.0.1", free_port())  # a replica of a master that is gone: read-only
    try:
        produce_all(setup.services.bootstrap, setup.delay, valid(setup.targets[0], 5, "during"))
        wait_for(lambda: bridge.get("/readyz")[0] == 503, 30, "/readyz 503")
        body = bridge.get("/readyz")[1]
        assert "READONLY" in body and "replica, not the master" in body, body
        # The probe may say it first; the stages' log lines follow at their next write.
        wait_for(lambda: "READONLY" in bridge.output(), 10, "the log to name READONLY")
        wait_for(
            lambda: "delay_bridge_redis_writable 0.0" in bridge.get("/metrics")[1],
            10,
            "the writable gauge at 0",
        )
    finally:
        client.replicaof("NO", "ONE")
        client.close()
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "ready again")
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 5, 60, "the records produced while read-only")
    finally:
        collector.close()


def test_redis_out_of_memory_shows_in_the_writable_gauge_and_counts_each_cancel_once(
    setup: Setup, scratch_redis: str, bridges: list[Bridge]
) -> None:
    """Redis a little below maxmemory: a batch of real records (whose own arguments take memory)
    is refused while the probe's tiny write still fits. The gauge must say Redis does not take
    the bridge's writes, and a cancel in such a batch is counted once, when it is applied."""
    bridge = setup.bridge(redis__url=scratch_redis).start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0]
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [(b"k", b"remind", delay_headers(target, after="1h", delay_id="remind-1"))],
    )
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the first record")
    client = redis.Redis.from_url(scratch_redis)
    used = int(cast(dict[str, Any], client.info("memory"))["used_memory"])
    client.config_set("maxmemory", used + 300_000)
    try:
        big = [
            (b"k", b"x" * 20_000, delay_headers(target, after="1h", delay_id=f"big-{i}"))
            for i in range(60)
        ]
        produce_all(
            setup.services.bootstrap, setup.delay, [*big, (b"k", b"", cancel_headers("remind-1"))]
        )
        wait_for(lambda: "out of memory" in bridge.get("/readyz")[1], 30, "/readyz names OOM")
        wait_for(
            lambda: metric(bridge, "delay_bridge_redis_writable") == 0,
            10,
            "the writable gauge at 0 while real writes are refused",
        )
        # What the probe does fits. Not at every instant: a retried batch's arguments count in
        # used_memory while Redis reads them, so a write at that instant is refused too.
        wait_for(lambda: _fits(client), 10, "a tiny write between the batch's retries")
    finally:
        client.config_set("maxmemory", 0)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 61, 60, "every record")
    wait_for(lambda: metric(bridge, "delay_bridge_redis_writable") == 1, 10, "writable again")
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "ready again")
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1
    assert metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}') == 0
    client.close()


def _fits(client: redis.Redis) -> bool:
    try:
        return bool(client.set("the-probe-still-fits", b"1"))
    except redis.exceptions.OutOfMemoryError:
        return False


def test_a_bridge_that_redis_refuses_never_joins_the_group(
    setup: Setup, acl_user: Callable[..., str], bridges: list[Bridge], admin: AdminClient
) -> None:
    url = acl_user("wrong", "~*", "+@all", password="right").replace(":right@", ":wrong@")
    bridge = setup.bridge(redis__url=url).start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 503, 30, "/readyz 503")
    wait_for(lambda: "not joining the consumer group" in bridge.output(), 30, "the log line")
    body = bridge.get("/readyz")[1]
    assert "refused the credentials" in body
    assert "kafka" not in body and "consumer" not in body  # Redis is the cause, and named alone
    assert bridge.get("/healthz")[0] == 200  # waiting, not stuck
    group = f"bridge-{setup.unique}"
    [described] = admin.describe_consumer_groups([group]).values()
    assert described.result(timeout=10).members == []


def test_an_unreachable_redis_is_named_alone(
    setup: Setup, bridges: list[Bridge], dead_port: int
) -> None:
    bridge = setup.bridge(redis__url=f"redis://127.0.0.1:{dead_port}/0").start()
    bridges.append(bridge)
    wait_for(lambda: "not joining the consumer group" in bridge.output(), 30, "the log line")
    status, body = bridge.get("/readyz")
    assert status == 503 and "redis" in body.lower()
    assert "kafka" not in body and "consumer" not in body, body


def test_permission_errors_are_named(
    setup: Setup, acl_user: Callable[..., str], bridges: list[Bridge]
) -> None:
    no_keys = setup.bridge("no-keys", redis__url=acl_user("nokeys", "~elsewhere:*", "+@all"))
    bridges.append(no_keys.start())
    no_config = setup.bridge("no-config", redis__url=acl_user("noconfig", "~*", "+@all", "-config"))
    bridges.append(no_config.start())
    wait_for(lambda: "NOPERM" in no_keys.get("/readyz")[1], 30, "NOPERM in /readyz")
    wait_for(lambda: no_config.get("/readyz")[0] == 200, 60, "the other bridge ready")
    wait_for(
        lambda: "could not check that Redis does not evict" in no_config.output(),
        30,
        "the skipped eviction check said once",
    )
    assert "NOPERM" in no_config.output()


def test_an_unreachable_kafka_does_not_flood_the_log(
    services: Services, unique: str, tmp_path: Path, dead_port: int
) -> None:
    env = bridge_env(
        f"127.0.0.1:{dead_port}",
        services.redis_url,
        kafka__group_id=f"g-{unique}",
        redis__key_prefix=f"test-{unique}",
    )
    bridge = Bridge(env, tmp_path / "bridge.log").start()
    try:
        wait_for(lambda: "Connection refused" in bridge.output(), 30, "the first connect error")
        window = time.monotonic() + 5
        wait_for(lambda: time.monotonic() > window, 10, "a 5 s window")
        noisy = [
            line
            for line in bridge.output().splitlines()
            if " ERROR " in line or " WARNING " in line
        ]
        # One line per distinct fault (consumer, producers, admin), not one per reconnect (each
        # client reconnects about seven times in 5 s: its backoff doubles from 0.1 s to 1 s).
        assert len(noisy) <= 12, "\n".join(noisy)
    finally:
        bridge.kill()


def test_start_up_asks_kafka_beside_the_wait_for_redis_not_one_question_after_another(
    services: Services, unique: str, dead_port: int
) -> None:
    """With Kafka unreachable, what start-up asks it before the consumer joins — the delay
    topics' retention, the first description of the topics — each waits out its 10 s timeout.
    They run side by side (and beside the wait for Redis): the consumer subscribes after one
    timeout, where it took two one after the other."""
    env = bridge_env(
        f"127.0.0.1:{dead_port}",
        services.redis_url,
        kafka__group_id=f"g-{unique}",
        redis__key_prefix=f"test-{unique}",
    )
    service = Service(from_mapping({}, env=env), CollectorRegistry())
    started = time.monotonic()
    runner = threading.Thread(target=service.run)
    runner.start()
    try:
        wait_for(
            lambda: any(t.name == "ingress" for t in threading.enumerate()),
            30,
            "the ingress started",
        )
        assert time.monotonic() - started < 15
    finally:
        service.stop_event.set()
        runner.join(60)
    assert not runner.is_alive()
