"""A delay topic deleted and created again, or a log behind Redis's watermark: detected, never
skipped over, and the records Redis still holds from before are delivered."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from bridge.store import Shard, Store
from tests.conftest import Services, TopicFactory, wait_for
from tests.integration.harness import Bridge, Setup
from tests.integration.test_recovery import delivered_once, due_in, rebuilds

pytestmark = pytest.mark.integration


@pytest.fixture
def one(services: Services, topics: TopicFactory, unique: str, tmp_path: Path) -> Setup:
    return Setup(services, topics("delay", 1, config={"retention.ms": "-1"}), [topics("out", 1)],
                 topics("dlq"), unique, tmp_path, topics("journal"))  # fmt: skip


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
    client.hset(Store(client, f"test-{one.unique}").keys(Shard(one.delay, 0)).meta,
                "ingested", "100")  # fmt: skip
    client.close()
    second = one.bridge("second").start()
    bridges.append(second)
    due_in(one, 3, 0, "after")  # offsets 2..4, below the watermark of 100
    counts = delivered_once(one, 5, "the records below the watermark")
    assert {f"after-{i}".encode() for i in range(3)} <= set(counts)
    assert f"delay topic {one.delay}[0] went back" in second.output()
    assert rebuilds(second, one) == 1
