"""Far-future records end to end: kept as references, read back from the real delay topic shortly
before they fall due and delivered on time; cancelled and replaced while references; dead-lettered
as payload-missing when the topic lost them; and a retention that could lose them refused."""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path
from typing import cast

import pytest
import redis
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_DELIVER_AT,
    H_ERROR,
    H_ERROR_DETAIL,
    H_ID,
    H_ORIGIN,
    H_TARGET_TOPIC,
    format_time_ms,
)
from bridge.store import Shard, Store
from testbed.harness import Bridge, Collector, Setup, metric, produce_all, wait_ready, wipe
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration

# A record due more than 4 s out is kept as a reference and read back from 2.5 s before its 1 s
# bucket starts (fetch_ahead, and half a bucket to read it in): 2-3.5 s before it is due.
TIERS = {"store__payload_horizon": "4s", "store__fetch_ahead": "2s"}
FAR_MS = 9_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def produce(setup: Setup, *records: tuple[str, int | None, list[tuple[str, bytes]]]) -> list[int]:
    """(value, delay ms, extra headers) records to the delay topic; returns their offsets. A
    delay of None: only the extra headers (a cancel)."""
    target = setup.targets[0].encode()
    coords = produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            (
                b"k",
                value.encode(),
                extra
                if delay is None
                else [(H_TARGET_TOPIC, target), (H_AFTER, f"{delay}ms".encode()), *extra],
            )
            for value, delay, extra in records
        ],
    )
    return [offset for _, offset in coords]


def store_of(setup: Setup) -> tuple[Store, Shard]:
    return Store(redis.Redis.from_url(setup.services.redis_url), f"test-{setup.unique}"), Shard(
        setup.delay, 0
    )


def started(setup: Setup, bridges: list[Bridge]) -> Bridge:
    """A bridge with TIERS, ready: a record produced then is stored FAR_MS less a moment before
    due, a reference (a start of seconds left some records within the horizon, stored whole)."""
    bridge = setup.bridge(**TIERS).start()
    bridges.append(bridge)
    assert wait_ready(bridge), "the bridge did not become ready"
    return bridge


def references(setup: Setup, count: int) -> None:
    """Wait until Redis holds ``count`` references and none of them whole."""
    store, shard = store_of(setup)
    try:
        wait_for(
            lambda: store.references.counts([shard]) == {shard: count}, 30, f"{count} references"
        )
    finally:
        store.client.close()


def on_time(
    collector: Collector, setup: Setup, due: dict[bytes, int]
) -> collections.Counter[bytes]:
    """Wait until every value in ``due`` arrived on the target; none before its due time."""
    target = setup.targets[0]
    collector.until(
        lambda _: {r.value for r in collector.of(target)} >= set(due), 60, "the records read back"
    )
    for r in collector.of(target):
        assert r.value in due, f"unexpected {r.value!r}"
        assert r.timestamp_ms >= due[r.value or b""], f"{r.value!r} delivered early"
    return collections.Counter(r.value or b"" for r in collector.of(target))


def test_far_future_records_are_read_back_and_delivered_on_time(
    one: Setup, bridges: list[Bridge]
) -> None:
    bridge = started(one, bridges)
    before = now_ms()
    far: list[tuple[str, int | None, list[tuple[str, bytes]]]] = [
        (f"far-{i}", FAR_MS + i * 50, []) for i in range(20)
    ]
    near: list[tuple[str, int | None, list[tuple[str, bytes]]]] = [
        (f"near-{i}", 500, []) for i in range(3)
    ]
    produce(one, *far, *near, ("far-id", FAR_MS, [(H_ID, b"mine")]))
    references(one, 21)
    store, shard = store_of(one)
    assert (
        cast(int, store.client.zcard(store.keys(shard).due)) <= 3
    )  # the near ones, if not delivered yet
    store.client.close()
    due = {v.encode(): before + (d or 0) for v, d, _ in [*far, *near, ("far-id", FAR_MS, [])]}
    collector = one.collector()
    try:
        counts = on_time(collector, one, due)
    finally:
        collector.close()
    assert set(counts.values()) == {1}
    assert metric(bridge, 'delay_bridge_read_back_total{result="stored"}') == 21
    assert metric(bridge, "delay_bridge_read_back_seconds_ahead_count") == 21
    # Read back 2-3.5 s ahead (1 s buckets, 2 s fetch_ahead): none of them at the last moment.
    assert metric(bridge, 'delay_bridge_read_back_seconds_ahead_bucket{le="1.0"}') == 0
    assert metric(bridge, "delay_bridge_references_messages") == 0


def test_a_bucket_is_read_back_fetch_ahead_before_its_first_record_is_due(
    one: Setup, bridges: list[Bridge]
) -> None:
    """fetch_ahead is the lead every record gets, the first of its bucket too: reading a bucket
    starts early enough to finish by then (here 2.5 s before the bucket starts)."""
    bridges.append(one.bridge(**TIERS).start())
    # The first instant of a 1 s bucket, far enough that the records are references even when
    # the bridge stores them 10 s after they are produced (CI: 5 s was not always enough).
    due = (now_ms() + FAR_MS + 6_000) // 1000 * 1000
    headers = [
        (H_TARGET_TOPIC, one.targets[0].encode()),
        (H_DELIVER_AT, format_time_ms(due).encode()),
    ]
    produce(one, *[(f"first-{i}", None, headers) for i in range(5)])
    references(one, 5)
    store, shard = store_of(one)
    try:
        wait_for(
            lambda: store.references.counts([shard]) == {shard: 0},
            30,
            "the read-back",
            interval=0.01,
        )
        read_back_ms = now_ms()
    finally:
        store.client.close()
    assert read_back_ms <= due - 2_000, f"read back {due - read_back_ms} ms before due"


def test_cancel_and_replace_reach_references(one: Setup, bridges: list[Bridge]) -> None:
    started(one, bridges)
    before = now_ms()
    produce(one, ("cancelled", FAR_MS, [(H_ID, b"c")]), ("old", FAR_MS, [(H_ID, b"r")]))
    references(one, 2)
    produce(
        one,
        ("", None, [(H_CANCEL, b"c")]),
        ("new", FAR_MS + 500, [(H_ID, b"r")]),
        ("last", FAR_MS + 1_000, []),
    )
    collector = one.collector()
    try:
        counts = on_time(
            collector, one, {b"new": before + FAR_MS + 500, b"last": before + FAR_MS + 1_000}
        )
    finally:
        collector.close()
    assert counts == {b"new": 1, b"last": 1}  # "cancelled" and "old" never, "last" came after


def test_a_reference_whose_record_is_gone_reaches_the_dlq_at_its_due_time(
    one: Setup, admin: AdminClient, bridges: list[Bridge]
) -> None:
    bridge = started(one, bridges)
    before = now_ms()
    offsets = produce(one, ("gone-0", FAR_MS, []), ("gone-1", FAR_MS, []), ("kept", FAR_MS, []))
    references(one, 3)
    # Deleted from the log before it is read back (as retention or kafka-delete-records does).
    deleted = admin.delete_records([TopicPartition(one.delay, 0, offsets[2])])
    for future in deleted.values():
        future.result(timeout=30)
    collector = one.collector()
    try:
        collector.until(
            lambda _: len(collector.of(one.dlq)) == 2 and bool(collector.of(one.targets[0])),
            60,
            "two payload-missing dead letters and the kept record",
        )
        letters = sorted(collector.of(one.dlq), key=lambda r: r.header(H_ORIGIN) or b"")
    finally:
        collector.close()
    for letter, offset in zip(letters, offsets[:2], strict=True):
        assert letter.header(H_ERROR) == b"payload-missing"
        assert letter.header(H_ORIGIN) == f"{one.delay}:0:{offset}".encode()
        assert f"offset {offset} of {one.delay}[0]".encode() in (
            letter.header(H_ERROR_DETAIL) or b""
        )
        assert letter.value is None and letter.key is None
        assert letter.timestamp_ms >= before + FAR_MS  # at its due time, not when found gone
    wait_for(
        lambda: metric(bridge, 'delay_bridge_dead_lettered_total{reason="payload-missing"}') == 2,
        10,
        "the dead letters counted once acknowledged",
    )
    assert metric(bridge, 'delay_bridge_read_back_total{result="missing"}') == 2


def test_references_are_rebuilt_when_redis_loses_them(one: Setup, bridges: list[Bridge]) -> None:
    started(one, bridges)
    before = now_ms()
    produce(one, *[(f"far-{i}", FAR_MS + 2_000, []) for i in range(5)])
    references(one, 5)
    assert wipe(one) > 0  # FLUSHALL, for this bridge's keys
    references(one, 5)  # read again from the committed offset: below every reference
    collector = one.collector()
    try:
        counts = on_time(
            collector, one, {f"far-{i}".encode(): before + FAR_MS + 2_000 for i in range(5)}
        )
    finally:
        collector.close()
    assert set(counts.values()) == {1}


def test_references_of_a_recreated_topic_reach_the_dlq_as_payload_missing(
    one: Setup, topics: TopicFactory, bridges: list[Bridge]
) -> None:
    first = one.bridge("first", **TIERS).start()
    bridges.append(first)
    before = now_ms()
    produce(one, ("old-0", FAR_MS, []), ("old-1", FAR_MS, []))
    references(one, 2)
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    topics.recreate(one.delay, 1)
    bridges.append(one.bridge("second", **TIERS).start())
    produce(one, ("new-0", 0, []))  # offset 0 again, in the new incarnation
    collector = one.collector()
    try:
        collector.until(
            lambda _: len(collector.of(one.dlq)) == 2 and bool(collector.of(one.targets[0])),
            60,
            "two payload-missing dead letters and the new record",
        )
    finally:
        collector.close()
    assert [r.value for r in collector.of(one.targets[0])] == [b"new-0"]
    for letter in collector.of(one.dlq):
        assert letter.header(H_ERROR) == b"payload-missing"
        assert b"deleted and created again" in (letter.header(H_ERROR_DETAIL) or b"")
        assert letter.timestamp_ms >= before + FAR_MS


def test_a_retention_shorter_than_max_delay_stops_start_up_with_references(
    services: Services, topics: TopicFactory, unique: str, tmp_path: Path, bridges: list[Bridge]
) -> None:
    short = Setup(
        services,
        topics("delay", 1, config={"retention.ms": "86400000"}),
        [topics("out", 1)],
        topics("dlq"),
        unique,
        tmp_path,
        topics("journal"),
    )
    refused = short.bridge("refused", limits__max_delay="2d").start()
    bridges.append(refused)
    assert refused.wait(60) == 2
    log = refused.output()
    assert "config error: store.references is on" in log and "retention.ms=86400000" in log
    assert "Traceback" not in log
    fits = short.bridge("fits", limits__max_delay="1d").start()
    bridges.append(fits)
    wait_for(lambda: fits.get("/readyz")[0] == 200, 60, "the bridge ready")
