"""Inputs nobody scripted, on the real servers: each record is stored, dead-lettered or refused on
its own, and nothing it carries stops the rest or takes the process down."""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import pytest
import redis
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_CRON,
    H_DELIVER_AT,
    H_ERROR,
    H_ERROR_DETAIL,
    H_EVERY,
    H_ID,
    H_ORIGIN,
    H_PAUSE,
    H_PRIORITY,
    H_TARGET_TOPIC,
    Headers,
)
from testbed.harness import (
    Bridge,
    Collector,
    Setup,
    ToPartition,
    metric,
    produce_all,
    produce_to,
    wait_ready,
)
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration


def test_due_times_before_2000_are_dead_lettered_and_the_rest_delivered_once(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A due time before 1970 used to be stored below its priority lane's floor: claimed by rank,
    the high one was never delivered and another record went twice; a normal one crashed the
    egress loop; Go's zero time (year 1) waited forever and pinned the partition's commit."""
    target = setup.targets[0].encode()
    soon = str(time.time_ns() // 1_000_000 + 2000).encode()

    def record(value: bytes, at: bytes, priority: bytes = b"normal") -> tuple[bytes, bytes, list]:  # type: ignore[type-arg]
        return (
            b"one-partition",
            value,
            [(H_TARGET_TOPIC, target), (H_DELIVER_AT, at), (H_PRIORITY, priority)],
        )

    refused = {
        b"just-before-1970": b"1969-12-31T23:59:59Z",
        b"go-zero-time": b"0001-01-01T00:00:00Z",
        b"moon-landing": b"1969-07-20T20:17:00Z",
        b"in-1999": b"1999-12-31T23:59:59.999Z",
    }
    records = [
        record(b"just-before-1970", refused[b"just-before-1970"], b"high"),
        record(b"go-zero-time", refused[b"go-zero-time"]),
        record(b"moon-landing", refused[b"moon-landing"]),
        record(b"in-1999", refused[b"in-1999"], b"low"),
        record(b"high-1", soon, b"high"),
        record(b"high-2", soon, b"high"),
        record(b"normal-1", soon),
    ]
    produce_all(setup.services.bootstrap, setup.delay, records)
    bridge = setup.bridge().start()
    bridges.append(bridge)
    collector = setup.collector()
    try:
        collector.until(
            lambda rs: len(rs) >= len(records), 60, "every record delivered or dead-lettered"
        )
        collector.poll(2.0)  # a duplicate would show up now
    finally:
        collector.close()
    delivered = sorted(r.value or b"" for r in collector.records if r.topic != setup.dlq)
    assert delivered == [b"high-1", b"high-2", b"normal-1"]
    dead = {r.value: r for r in collector.of(setup.dlq)}
    assert set(dead) == set(refused)
    for value, r in dead.items():
        assert r.header(H_ERROR) == b"bad-due-time", value
        assert b"before 2000-01-01" in (r.header(H_ERROR_DETAIL) or b""), value
    assert bridge.proc is not None and bridge.proc.poll() is None, bridge.output()


def _assert_one_after_per_partition(collector: Collector, setup: Setup) -> None:
    """The records of _deliver_one_per_partition(setup, 3, "after") reached the target, once."""
    assert sorted(r.value or b"" for r in collector.of(setup.targets[0])) == [
        b"after-0",
        b"after-1",
        b"after-2",
    ]


def _deliver_one_per_partition(setup: Setup, partitions: int, tag: str) -> ToPartition:
    return [
        (p, f"{tag}-{p}".encode(), [(H_TARGET_TOPIC, setup.targets[0].encode()), (H_AFTER, b"0ms")])
        for p in range(partitions)
    ]


def test_a_dead_letter_copy_that_does_not_fit_goes_without_its_value(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path, bridges: list[Bridge]
) -> None:
    """A 2 MB record (compressed by its producer) on a delay topic that takes 5 MB is too-large;
    its DLQ copy was refused (by the bridge's producer, and by a DLQ topic that takes less), the
    batch was retried forever and nothing was ingested on any partition."""
    setup = Setup(
        services,
        topics("delay", 3, config={"max.message.bytes": "5242880"}),
        [topics("out")],
        topics("dlq", config={"max.message.bytes": "4000"}),
        unique,
        tmp_path,
        topics("journal"),
    )
    target = setup.targets[0].encode()
    oversized: ToPartition = [
        (0, b"x" * 2_000_000, [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms")]),  # too-large
        (1, b"y" * 10_000, [(H_TARGET_TOPIC, b"bad\xff"), (H_AFTER, b"0ms")]),  # bad-header
    ]
    produce_to(
        services.bootstrap,
        setup.delay,
        oversized,
        **{"compression.type": "lz4", "message.max.bytes": "5242880"},
    )
    produce_to(services.bootstrap, setup.delay, _deliver_one_per_partition(setup, 3, "after"))
    bridges.append(setup.bridge().start())
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 5, 60, "3 deliveries and 2 dead letters")
    finally:
        collector.close()
    _assert_one_after_per_partition(collector, setup)
    dead = {int((r.header(H_ORIGIN) or b"").split(b":")[1]): r for r in collector.of(setup.dlq)}
    assert set(dead) == {0, 1}
    for partition, reason, size in ((0, b"too-large", 2_000_000), (1, b"bad-header", 10_000)):
        r = dead[partition]
        assert r.value is None and r.key == b"k"
        assert r.header(H_ERROR) == reason
        detail = (r.header(H_ERROR_DETAIL) or b"").decode()
        assert f"value of {size} bytes left out" in detail, detail
        assert r.header(H_TARGET_TOPIC) is not None  # the headers are kept


def test_a_schedule_that_cannot_be_goes_to_the_dlq_as_bad_schedule_not_once_as_a_one_shot(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A cron record whose expression cannot be (that also carries a due time), an interval
    without the delay-id a schedule needs, and a pause that also names a target each reach the
    DLQ whole as bad-schedule, nothing of them reaches the target, and their partitions go on."""
    target = setup.targets[0].encode()
    schedules: ToPartition = [
        (
            0,
            b"digest",
            [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms"), (H_CRON, b"61 9 * * 1-5"), (H_ID, b"d")],
        ),
        (1, b"poll", [(H_TARGET_TOPIC, target), (H_EVERY, b"5m")]),
        (2, None, [(H_PAUSE, b"poll"), (H_TARGET_TOPIC, target)]),
    ]
    produce_to(setup.services.bootstrap, setup.delay, schedules)
    produce_to(setup.services.bootstrap, setup.delay, _deliver_one_per_partition(setup, 3, "after"))
    bridge = setup.bridge().start()
    bridges.append(bridge)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 6, 60, "3 deliveries and 3 dead letters")
        collector.poll(1.0)  # a one-shot delivery of the cron record would show up now
    finally:
        collector.close()
    _assert_one_after_per_partition(collector, setup)
    dead = {int((r.header(H_ORIGIN) or b"").split(b":")[1]): r for r in collector.of(setup.dlq)}
    assert sorted(dead) == [0, 1, 2]
    for partition, value, named in ((0, b"digest", "delay-cron: "), (1, b"poll", "delay-id: ")):
        assert dead[partition].value == value and dead[partition].key == b"k"
        assert dead[partition].header(H_ERROR) == b"bad-schedule"
        detail = (dead[partition].header(H_ERROR_DETAIL) or b"").decode()
        assert detail.startswith(named), detail
    assert dead[2].header(H_PAUSE) == b"poll" and dead[2].header(H_ERROR) == b"bad-schedule"
    assert metric(bridge, 'delay_bridge_dead_lettered_total{reason="bad-schedule"}') == 3


def test_a_dlq_refusal_holds_its_partition_only(
    setup: Setup, topics: TopicFactory, bridges: list[Bridge], admin: AdminClient
) -> None:
    """A record the DLQ refuses (here: the DLQ does not exist yet) holds its own partition from its
    offset on; the other partitions go on, and /readyz names the partition held."""
    admin.delete_topics([setup.dlq])[setup.dlq].result(timeout=30)
    bad: ToPartition = [(0, b"bad", [(H_AFTER, b"0ms")])]  # no target: missing-target
    produce_to(setup.services.bootstrap, setup.delay, bad)
    produce_to(setup.services.bootstrap, setup.delay, _deliver_one_per_partition(setup, 3, "after"))
    bridge = setup.bridge().start()
    bridges.append(bridge)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 2, 60, "the other partitions' deliveries")
        assert sorted(r.value or b"" for r in collector.records) == [b"after-1", b"after-2"]
        held = f"{setup.delay}[0] waits at offset 0"  # once the DLQ's refusal has come back
        wait_for(lambda: held in bridge.get("/readyz")[1], 30, "/readyz naming the held partition")
        assert bridge.get("/readyz")[0] == 503
        topics.recreate(setup.dlq)
    finally:
        collector.close()
    collector = setup.collector()  # subscribed once the DLQ exists
    try:
        collector.until(lambda rs: len(rs) >= 4, 60, "the held record and the one after it")
        collector.poll(1.0)  # a duplicate would show up now
    finally:
        collector.close()
    assert sorted(r.value or b"" for r in collector.records) == [
        b"after-0",
        b"after-1",
        b"after-2",
        b"bad",
    ]
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "/readyz 200 once the DLQ exists")


def test_a_delivery_failed_copy_too_large_for_the_dlq_goes_without_its_value(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path, bridges: list[Bridge]
) -> None:
    """A record its target refuses as too large goes to the DLQ as delivery-failed; a DLQ that
    refused the copy too had it released, claimed again with its attempts back at 0, forever."""
    small = {"max.message.bytes": "1000"}
    setup = Setup(
        services,
        topics("delay"),
        [topics("out", config=small)],
        topics("dlq", config=small),
        unique,
        tmp_path,
        topics("journal"),
    )
    bridges.append(setup.bridge(egress__max_attempts="2").start())
    headers: Headers = [(H_TARGET_TOPIC, setup.targets[0].encode()), (H_AFTER, b"0ms")]
    produce_all(services.bootstrap, setup.delay, [(b"k", b"x" * 5000, headers)])
    dead = setup.await_value(None, 60, "the dead letter")
    assert [r.topic for r in dead] == [setup.dlq]
    assert dead[0].header(H_ERROR) == b"delivery-failed" and dead[0].key == b"k"
    detail = (dead[0].header(H_ERROR_DETAIL) or b"").decode()
    assert "failed 2 times" in detail and "value of 5000 bytes left out" in detail, detail


def test_a_delay_topic_that_gains_partitions_has_them_consumed_within_30_s(
    setup: Setup, bridges: list[Bridge], admin: AdminClient
) -> None:
    """librdkafka refreshes topic metadata every 5 minutes by default: a partition added to a
    delay topic was not assigned 40 s later, and its records waited unread."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    admin.create_partitions([NewPartitions(setup.delay, 6)])[setup.delay].result(timeout=30)
    # The broker's metadata follows the controller's a moment later (seconds on a busy machine):
    # a record produced to a partition it does not know yet is refused. From when it knows them.
    wait_for(
        lambda: len(admin.list_topics(setup.delay, timeout=10).topics[setup.delay].partitions) == 6,
        30,
        "the broker's metadata with the 6 partitions",
    )
    grown = time.monotonic()
    produce_to(setup.services.bootstrap, setup.delay, _deliver_one_per_partition(setup, 6, "grown"))
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 6, 30, "a record from each of the 6 partitions")
    finally:
        collector.close()
    assert time.monotonic() - grown < 30
    assert sorted(r.value or b"" for r in collector.records) == [
        f"grown-{p}".encode() for p in range(6)
    ]


_GUARANTEES = "(the delivery guarantees rely on it)"


@pytest.mark.parametrize(
    ("setting", "line"),
    [
        (
            "consumer:\n    auto.offset.reset: latest",
            f"kafka.consumer.auto.offset.reset: must be earliest {_GUARANTEES}",
        ),
        (
            "consumer:\n    enable.auto.commit: 'false'",
            f"kafka.consumer.enable.auto.commit: must be true {_GUARANTEES}",
        ),
        (
            "producer:\n    message.timeout.ms: 60000",
            "kafka.producer.message.timeout.ms: 60000 must be below egress.lease (30000 ms), or a "
            "lease would expire while its record is in flight",
        ),
    ],
    ids=["latest", "no-auto-commit", "timeout-alias"],
)
def test_a_client_setting_the_guarantees_rest_on_is_refused_at_start_up(
    setup: Setup, bridges: list[Bridge], setting: str, line: str
) -> None:
    """``kafka.consumer`` and ``kafka.producer`` pass librdkafka properties through. With
    auto.offset.reset=latest, a partition added to a delay topic was read from where it ended
    when it was assigned, up to 10 s after it was added, and the records produced to it meanwhile
    were never delivered (a record to each of six partitions, three of them new: those three
    never came). With enable.auto.commit=false, the group's offsets never followed the records
    stored (none committed 15 s after five were delivered): a Redis loss without the journal
    delivered the whole log again. message.timeout.ms, librdkafka's other name for
    delivery.timeout.ms, passed the check that keeps it below the lease and, set after the
    bridge's value, replaced it. Each stops start-up in one line."""
    config = setup.tmp / "client.yaml"
    config.write_text(f"kafka:\n  {setting}\n")
    bridge = setup.bridge(config=str(config)).start()
    bridges.append(bridge)
    assert bridge.wait(30) == 2
    assert bridge.output().splitlines() == [f"delay-bridge: config error: {line}"]


def test_a_consumer_told_to_report_partition_ends_delivers_and_logs_no_warning_for_them(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """With ``kafka.consumer.enable.partition.eof: true`` (passed through), each time a partition
    was read to its end the ingress logged a WARNING with the consumer's error: at a steady load,
    a line per partition per fetch that caught up. The end of a partition is no error."""
    config = setup.tmp / "eof.yaml"
    config.write_text("kafka:\n  consumer:\n    enable.partition.eof: 'true'\n")
    bridge = setup.bridge(config=str(config)).start()
    bridges.append(bridge)
    for round_ in range(3):  # each round reads every partition to its end again
        produce_to(
            setup.services.bootstrap,
            setup.delay,
            _deliver_one_per_partition(setup, 3, f"r{round_}"),
        )
        delivered = 3 * (round_ + 1)  # waited for within the turn: no late binding to fear
        wait_for(
            lambda: metric(bridge, "delay_bridge_delivered_total") >= delivered,  # noqa: B023
            30,
            f"round {round_} delivered",
        )
    assert "PARTITION_EOF" not in bridge.output()


def test_a_cancel_or_replacement_in_another_partition_finds_its_record(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A schedule's identity is (delay topic, delay-id): a cancel produced with another
    partitioner (or after the topic grew) landed in another partition, found nothing, and the
    record was delivered; a replacement there delivered both."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    target = setup.targets[0].encode()

    def schedule(delay_id: bytes, after: bytes) -> Headers:
        return [(H_TARGET_TOPIC, target), (H_AFTER, after), (H_ID, delay_id)]

    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, b"cancelled", schedule(b"order-9", b"8s")),
            (0, b"replaced", schedule(b"order-10", b"8s")),
        ],
    )
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") >= 2, 30, "both stored")
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (1, None, [(H_CANCEL, b"order-9")]),
            (2, b"replacement", schedule(b"order-10", b"1s")),
            (2, b"marker", [(H_TARGET_TOPIC, target), (H_AFTER, b"9s")]),
        ],
    )
    records = setup.await_value(b"marker", 60, "the marker, due after the others")
    assert sorted(r.value or b"" for r in records) == [b"marker", b"replacement"]
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1
    assert metric(bridge, "delay_bridge_replaced_total") == 1


def test_a_cancel_behind_a_held_record_still_wins(
    setup: Setup, topics: TopicFactory, bridges: list[Bridge], admin: AdminClient
) -> None:
    """R (delay-id x, due in 6 s), a record that needs the DLQ, then the cancel of x, in one
    partition, while the DLQ does not exist: the partition waits at the middle record. It used to
    count as stalled after 2 s, R was claimed at its due time and delivered, and the cancel, read
    once the DLQ appeared, found nothing. A held partition is behind, not idle."""
    target = setup.targets[0].encode()
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready: the partitions read live")
    admin.delete_topics([setup.dlq])[setup.dlq].result(timeout=30)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, b"R", [(H_TARGET_TOPIC, target), (H_AFTER, b"6s"), (H_ID, b"x")]),
            (0, b"needs-the-dlq", [(H_AFTER, b"0ms")]),
            (0, None, [(H_CANCEL, b"x")]),
            (0, b"marker", [(H_TARGET_TOPIC, target), (H_AFTER, b"8s")]),
        ],
    )
    wait_for(
        lambda: f"{setup.delay}[0] waits at offset 1" in bridge.get("/readyz")[1],
        30,
        "the partition held at the record that needs the DLQ",
    )
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 8, 20, "R's due time passing while held")
    topics.recreate(setup.dlq)
    records = setup.await_value(b"marker", 60, "the marker")
    assert sorted(r.value or b"" for r in records) == [b"marker", b"needs-the-dlq"]


def test_each_loop_meets_the_values_that_stopped_it_and_goes_on(
    setup: Setup, bridges: list[Bridge], redis_client: redis.Redis
) -> None:
    """What once took a loop (and the process) down now decides one record's fate:
    - a record with 70,000 headers (Kafka sets no limit) stopped the ingress: the stored form
      had two bytes for the count. Stored and delivered whole now, with every header;
    - a stored record whose bytes do not decode (corrupted in Redis, or written by another
      program) stopped the mover. It goes to the DLQ as payload-missing, its origin named."""
    target = setup.targets[0].encode()
    many: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms"), *[("h", None)] * 70_000]
    due_later = str(time.time_ns() // 1_000_000 + 60_000).encode()
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, b"many-headers", many),
            (1, b"corrupted", [(H_TARGET_TOPIC, target), (H_DELIVER_AT, due_later)]),
        ],
    )
    bridge = setup.bridge().start()
    bridges.append(bridge)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 1, 60, "the record with 70,000 headers")
        delivered = collector.records[0]
        assert delivered.value == b"many-headers"
        assert sum(1 for name, _ in delivered.headers if name == "h") == 70_000
        # The other record, stored for a minute from now, is corrupted in place, due now.
        due = f"test-{setup.unique}:{{{setup.delay}:1}}:schedule"
        wait_for(lambda: redis_client.zcard(due) == 1, 30, "the second record stored")
        (stored,) = cast(list[bytes], redis_client.zrange(due, 0, 0))
        redis_client.zadd(due, {stored[:8] + b"\x09not a record": time.time_ns() // 1_000_000})
        redis_client.zrem(due, stored)
        collector.until(lambda rs: len(rs) >= 2, 60, "the corrupted record dead-lettered")
    finally:
        collector.close()
    (dead,) = collector.of(setup.dlq)
    assert dead.header(H_ERROR) == b"payload-missing"
    assert dead.header(H_ORIGIN) == f"{setup.delay}:1:0".encode()
    assert b"does not decode" in (dead.header(H_ERROR_DETAIL) or b"")
    assert len(collector.of(setup.targets[0])) == 1
    assert bridge.proc is not None and bridge.proc.poll() is None, bridge.output()
    assert wait_ready(bridge)
