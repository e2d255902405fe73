"""A delay topic deleted and created again, or a log behind Redis's watermark: detected, never
skipped over, and the records Redis still holds from before are delivered."""

from __future__ import annotations

import collections
import contextlib
import signal
from pathlib import Path

import pytest
import redis

from bridge.message import H_AFTER, H_TARGET_TOPIC
from bridge.store import Shard, Store
from testbed.harness import Bridge, Setup, produce_all
from tests.conftest import Services, TopicFactory, wait_for
from tests.integration.test_recovery import delivered_once, due_in, rebuilds, values_delivered

pytestmark = pytest.mark.integration


@pytest.fixture
def one(services: Services, topics: TopicFactory, unique: str, tmp_path: Path) -> Setup:
    return Setup(
        services,
        topics("delay", 1, config={"retention.ms": "-1"}),
        [topics("out", 1)],
        topics("dlq"),
        unique,
        tmp_path,
        topics("journal"),
    )


def stored(setup: Setup, watermark: int) -> None:
    client = redis.Redis.from_url(setup.services.redis_url)
    store, shard = Store(client, f"test-{setup.unique}"), Shard(setup.delay, 0)
    try:
        wait_for(
            lambda: store.inventory.watermarks([shard]) == {shard: watermark}, 30, "records stored"
        )
    finally:
        client.close()


def test_a_recreated_delay_topic_is_read_from_its_beginning(
    one: Setup, topics: TopicFactory, bridges: list[Bridge]
) -> None:
    first = one.bridge("first").start()
    bridges.append(first)
    due_in(one, 3, 6_000, "old")  # offsets 0..2 of the first incarnation, still waiting
    stored(one, 2)
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    topics.recreate(one.delay, 1, config={"retention.ms": "-1"})
    second = one.bridge("second").start()
    bridges.append(second)
    due_in(one, 4, 0, "new")  # offsets 0..3 again, in the new incarnation
    counts = delivered_once(one, 7, "both incarnations' records")
    assert counts == {f"old-{i}".encode(): 1 for i in range(3)} | {
        f"new-{i}".encode(): 1 for i in range(4)
    }
    log = second.output()
    assert "ERROR" in log and f"delay topic {one.delay}[0] was deleted and created again" in log
    assert rebuilds(second, one) == 1


def test_a_watermark_beyond_the_log_end_is_not_skipped_over(
    one: Setup, bridges: list[Bridge]
) -> None:
    """A log restored from a backup, or truncated: Redis's watermark is past its end."""
    first = one.bridge("first").start()
    bridges.append(first)
    due_in(one, 2, 0, "before")  # offsets 0..1
    stored(one, 1)
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    client = redis.Redis.from_url(one.services.redis_url)
    client.hset(
        Store(client, f"test-{one.unique}").keys(Shard(one.delay, 0)).meta, "ingested", "100"
    )
    client.close()
    second = one.bridge("second").start()
    bridges.append(second)
    due_in(one, 3, 0, "after")  # offsets 2..4, below the watermark of 100
    counts = delivered_once(one, 5, "the records below the watermark")
    assert {f"after-{i}".encode() for i in range(3)} <= set(counts)
    assert f"delay topic {one.delay}[0] went back" in second.output()
    assert rebuilds(second, one) == 1


def test_a_delay_topic_recreated_under_a_running_exactly_once_bridge_loses_and_repeats_nothing(
    one: Setup, topics: TopicFactory, bridges: list[Bridge]
) -> None:
    """Exactly once, the delay topic deleted and created again while records of it are being
    delivered: the new incarnation's records, at the offsets the old one's just had, are
    delivered (not taken for those committed lately), and the old records in flight then are
    not delivered a second time by the take-over of their retired incarnation."""
    bridge = one.bridge(egress__exactly_once="true", egress__transaction="1s").start()
    bridges.append(bridge)
    now = due_in(one, 300, 0, "now")  # offsets 0..299, delivered before the recreation
    delivered_once(one, 300, "the first incarnation's first records")
    old = [  # offsets 300..3299, falling due over 21 s: in flight when the topic goes
        (
            None,
            f"old-{i}".encode(),
            [(H_TARGET_TOPIC, one.targets[0].encode()), (H_AFTER, f"{3_000 + 7 * i}ms".encode())],
        )
        for i in range(3000)
    ]
    produce_all(one.services.bootstrap, one.delay, old)
    stored(one, now[-1] + 3000)
    counts: collections.Counter[bytes] = collections.Counter()
    collector = one.collector()
    try:
        collector.until(lambda rs: len(rs) >= 300 + 300, 60, "records of the second batch")
        topics.recreate(one.delay, 1, config={"retention.ms": "-1"})
        due_in(one, 300, 0, "new")  # offsets 0..299 again, in the new incarnation
        with contextlib.suppress(AssertionError):  # what is missing is named below
            collector.until(lambda rs: len(rs) >= 3600, 60, "both incarnations' records")
        collector.poll(2.0)  # anything more would be a duplicate
        counts = values_delivered(collector, one)
    finally:
        collector.close()
    expected = {
        f"{tag}-{i}".encode()
        for tag, n in (("now", 300), ("old", 3000), ("new", 300))
        for i in range(n)
    }
    missing = sorted(expected - set(counts))
    twice = sorted(v for v, n in counts.items() if n > 1)
    assert not missing, f"{len(missing)} never delivered, e.g. {missing[:3]}"
    assert not twice, f"{len(twice)} delivered twice, e.g. {twice[:3]}"
    log = bridge.output()
    assert "was deleted and created again" in log or f"{one.delay}[0] went back" in log
