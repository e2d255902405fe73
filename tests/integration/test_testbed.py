"""The test bed's own readers, on the real broker: what they count is what the bridge did."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from testbed.harness import Collector, produce_to
from tests.conftest import Services, TopicFactory


def test_a_collector_reading_its_topics_again_counts_each_record_once(
    services: Services, topics: TopicFactory, unique: str
) -> None:
    """A collector's group commits nothing, so one that rebalances (its subscription met a topic's
    metadata late, say) reads its partitions again from their start: a record read twice at the
    same position is one delivery, never a duplicate the bridge made."""
    topic = topics("out", 2)
    produce_to(services.bootstrap, topic, [(p % 2, b"v%d" % p, []) for p in range(6)])
    collector = Collector(services.bootstrap, [topic], f"check-{unique}")
    try:
        collector.until(lambda rs: len(rs) >= 6, 60, "the six records")
        assert collector.consumer is not None
        for p in range(2):  # what a rebalance without a commit does to the positions
            collector.consumer.seek(TopicPartition(topic, p, OFFSET_BEGINNING))
        collector.until(lambda _: collector.again >= 6, 60, "the six records read again")
        collector.poll(0.5)
    finally:
        collector.close()
    assert sorted(r.value or b"" for r in collector.records) == [b"v%d" % p for p in range(6)]
    assert collector.again == 6


def test_a_record_the_broker_refuses_fails_the_produce_instead_of_vanishing(
    services: Services, topics: TopicFactory
) -> None:
    """A record produced to a partition the broker does not know yet (its topic just grew, and the
    broker's metadata lags) was refused in its delivery report, which nobody read: the test went
    on as if it had been produced, and waited for a delivery that could never come."""
    topic = topics("grown-late", 3)
    with pytest.raises(AssertionError, match=r"partition 5: .*UNKNOWN_PARTITION"):
        produce_to(services.bootstrap, topic, [(0, b"kept", []), (5, b"refused", [])])
