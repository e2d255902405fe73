"""The read-back's consumer on the real broker: what it costs once it has nothing left to read."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer

from bridge.config import load, read_back_settings
from bridge.readback import Reader
from bridge.readback.confirm import IdReader
from bridge.store import Shard
from testbed.harness import produce_all, produce_to
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration


class Requests:
    """Requests a consumer sent to the broker, from its statistics (every 100 ms, served by its
    poll)."""

    def __init__(self) -> None:
        self.sent = 0
        self.reports = 0

    def stats(self, stats_json: str) -> None:
        self.sent = sum(b["tx"] for b in json.loads(stats_json)["brokers"].values())
        self.reports += 1

    def over(self, consumer: Consumer, reports: int) -> int:
        """Requests sent between the next report and ``reports`` reports after it."""

        def reported(count: int) -> bool:
            consumer.poll(0.05)
            return self.reports >= count

        wait_for(lambda: reported(self.reports + 1), 10, "consumer statistics")
        first, seen = self.sent, self.reports
        wait_for(lambda: reported(seen + reports), 10 + reports, "consumer statistics")
        return self.sent - first


@pytest.fixture
def reader(services: Services) -> Iterator[tuple[Reader, Requests]]:
    config = load(None, {"DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS": services.bootstrap})
    requests = Requests()
    consumer = Consumer(
        {**read_back_settings(config), "statistics.interval.ms": 100, "stats_cb": requests.stats}
    )
    made = Reader(consumer)
    yield made, requests
    made.close()


def test_a_reader_done_reading_leaves_the_broker_alone(
    services: Services, topics: TopicFactory, reader: tuple[Reader, Requests]
) -> None:
    read, requests = reader
    topic = topics("delay", 1)
    produce_all(services.bootstrap, topic, [(b"k", b"v", []) for _ in range(5)])
    assert all(m is not None for m in read.read(Shard(topic, 0), [0, 4]).values())
    read.release()
    # Still assigned at the log's end, it fetched ~800 times a second (17% of the broker's core).
    sent = requests.over(read.consumer, 20)  # 2 s
    assert sent < 40, f"{sent} requests in 2 s with nothing to read"
    assert [m.value() for m in read.read(Shard(topic, 0), [2]).values() if m] == [b"v"]


def test_which_partitions_hold_records_is_read_in_kafka(
    services: Services, topics: TopicFactory, reader: tuple[Reader, Requests]
) -> None:
    """What a cancel that found nothing asks of the partitions Redis holds no state of: partition
    0 holds records (Redis lost its state), partition 1 never had one. Once found to hold records,
    a partition is not asked again; an empty one is, a second on."""
    read, _ = reader
    topic = topics("delay", 2)
    produce_to(services.bootstrap, topic, [(0, b"v", [])])
    ids = IdReader(lambda: read, load(None, {}).rules())
    both = [Shard(topic, 0), Shard(topic, 1)]
    assert ids.logged(both) == {Shard(topic, 0)}
    assert read.bounds(Shard(topic, 0)) == (0, 1) and read.bounds(Shard(topic, 1)) == (0, 0)
    produce_to(services.bootstrap, topic, [(1, b"v", [])])
    assert ids.logged(both) == {Shard(topic, 0)}  # partition 1: asked again a second on
    wait_for(lambda: ids.logged(both) == set(both), 5, "partition 1 asked again")


def test_a_read_past_the_log_or_across_a_gap_returns_once_kafka_has_answered(
    services: Services, topics: TopicFactory
) -> None:
    """A run of offsets the log ends before, or that spans offsets holding no record (a
    transaction's markers), waited for its poll's whole timeout — half a second a run, and a
    catch-up that met a cancel naming such a default id per batch read again at 2 runs a second
    (the adversary's last bridge: 57 runs, 28 s). With a poll of a minute, each read here still
    comes back as soon as Kafka has said what is there."""
    config = load(None, {"DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS": services.bootstrap})
    topic = topics("delay", 1)
    produce_all(services.bootstrap, topic, [(b"k", b"v", []) for _ in range(5)])
    producer = Producer({"bootstrap.servers": services.bootstrap, "transactional.id": topic})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, b"in-a-transaction", partition=0)
    producer.commit_transaction(10)  # offset 5, its marker at 6
    read = Reader(Consumer(read_back_settings(config)), poll_s=60.0)
    answers: list[dict[int, bool]] = []

    def reads() -> None:
        for offsets in ([3, 9], [4, 5, 6], [7, 8], [6]):
            answers.append(
                {o: m is not None for o, m in read.read(Shard(topic, 0), offsets).items()}
            )

    thread = threading.Thread(target=reads, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(answers) == 4, 20, "four reads answered")
    finally:
        thread.join(70)
        read.close()
    assert answers == [
        {3: True, 9: False},
        {4: True, 5: True, 6: False},
        {7: False, 8: False},
        {6: False},
    ]


def test_a_read_asks_the_leader_for_the_log_end_once_however_many_runs_lie_past_it(
    services: Services, topics: TopicFactory
) -> None:
    """Runs of offsets past the log's end (a log truncated, a topic made again) each asked the
    leader for the end: one round trip a run. One read asks once."""
    config = load(None, {"DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS": services.bootstrap})
    topic = topics("delay", 1)
    produce_all(services.bootstrap, topic, [(b"k", b"v", []) for _ in range(5)])
    asked: list[Shard] = []

    class Counting(Reader):
        def bounds(self, shard: Shard, timeout_s: float = 2.0) -> tuple[int, int]:
            asked.append(shard)
            return super().bounds(shard, timeout_s)

    read = Counting(Consumer(read_back_settings(config)))
    try:
        got = read.read(Shard(topic, 0), [2, 10_000, 11_000, 12_000, 13_000])
    finally:
        read.close()
    assert {o: m is not None for o, m in got.items()} == {
        2: True,
        10_000: False,
        11_000: False,
        12_000: False,
        13_000: False,
    }
    assert len(asked) == 1
