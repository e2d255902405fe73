"""A rebuild that fails half-way through a batch: the batch is read again, and what of it was
stored already is not taken for offsets that went back."""

from __future__ import annotations

import logging
import threading

import pytest
import redis
from prometheus_client import CollectorRegistry

import bridge.ingress.consumer
import bridge.positions
from bridge.config import from_mapping
from bridge.message import H_AFTER, H_TARGET_TOPIC
from bridge.service import Service
from bridge.store import Shard
from testbed.harness import bridge_env, produce_all
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration


def test_a_batch_read_again_after_a_failed_rebuild_retires_nothing(
    services: Services,
    topics: TopicFactory,
    unique: str,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis lost one partition's state while a batch held records of two. The batch stored the
    other partition's share, then the rebuild's read of the committed offsets timed out (the
    coordinator moving; here a timeout too short for any answer, from the real broker) and the
    whole batch was read again: the partition stored already read as "offsets went back", was
    retired and read from its beginning, and every record delivered from it would go again."""
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
    # No commit during the test: the loss is found by the batch's add, not by the commit's read.
    monkeypatch.setattr(bridge.ingress.consumer, "COMMIT_INTERVAL_S", 3600.0)
    service = Service(from_mapping({}, env=env), CollectorRegistry())
    shards = [Shard(delay, 0), Shard(delay, 1)]
    headers = [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"1h")]
    runner = threading.Thread(target=service.run)
    caplog.set_level(logging.INFO)
    runner.start()
    try:
        wait_for(lambda: service.ingress.assigned == set(shards), 60, "the partitions assigned")
        produce_all(services.bootstrap, delay, [(b"k%d" % i, b"v", headers) for i in range(40)])
        wait_for(lambda: all(s in service.ingress.marks for s in shards), 30, "both stored")
        # Redis loses partition 1's state (its keys gone); the next batch holds both partitions.
        lost = shards[1]
        for key in redis_client.scan_iter(f"test-{unique}:{{{lost.topic}:{lost.partition}}}:*"):
            redis_client.delete(key)
        monkeypatch.setattr(bridge.positions, "COMMITTED_TIMEOUT_S", 0.000_001)
        produce_all(services.bootstrap, delay, [(b"k%d" % i, b"v", headers) for i in range(40)])
        wait_for(
            lambda: "reading committed offsets for a rebuild failed" in caplog.text,
            30,
            "the rebuild's read of the committed offsets to fail",
        )
        monkeypatch.setattr(bridge.positions, "COMMITTED_TIMEOUT_S", 10.0)
        wait_for(lambda: "ingress stores batches again" in caplog.text, 60, "the batch stored")
        retired = redis_client.smembers(f"test-{unique}:{{{delay}:0}}:retired")
        assert not retired, "partition 0 was retired"
        assert "went back" not in caplog.text
        went_back = service.metrics.rebuilds.labels(delay_topic=delay, cause="offsets-went-back")
        assert went_back._value.get() == 0
    finally:
        service.stop_event.set()
        runner.join(60)
    assert not runner.is_alive()
