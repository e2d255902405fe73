"""Exactly-once delivery (``egress.exactly_once``) on a real broker and Redis: each record reaches a
read_committed consumer once, through a crash of the bridge and a frozen replica that wakes after
its partitions were taken over."""

from __future__ import annotations

import collections
import signal
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from bridge.journal import decode_entries
from bridge.kafka import headers_of
from bridge.message import H_AFTER, H_DELIVER_AT, H_ID, H_TARGET_TOPIC, Headers
from testbed.harness import (
    Bridge,
    Collector,
    Setup,
    ToPartition,
    assert_no_garbage_since,
    check_delivery,
    cycle_collector,
    delivered,
    fast_takeover,
    metric,
    produce_all,
    produce_to,
    roll_back,
    schedule,
    snapshot_keys,
    wait_ready,
    wipe,
    with_faults,
    with_session_timeout,
)
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

EXACTLY_ONCE = {"egress__exactly_once": "true"}


def each_once(collector: Collector, setup: Setup, expected: dict[str, int], timeout: float) -> None:
    """Wait for every expected record, and a little longer for a second copy: each arrived once,
    and none before it was due."""
    collector.until(lambda rs: len(rs) >= len(expected), timeout, "every record")
    collector.poll(2.0)  # anything more would be a duplicate
    counts = check_delivery(delivered(collector, setup), expected)
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} delivered more than once, e.g. {twice[:3]}"


def journaled(bootstrap: str, journal: str) -> collections.Counter[tuple[str, int, int]]:
    """How many committed journal entries name each delay-topic record (topic, partition,
    offset)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "journal",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    partitions = consumer.list_topics(journal, timeout=10).topics[journal].partitions
    consumer.assign([TopicPartition(journal, p, 0) for p in partitions])
    counts: collections.Counter[tuple[str, int, int]] = collections.Counter()
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    while len(at_end) < len(partitions) and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.2):
            if msg.error() is not None:
                at_end.add(msg.partition() or 0)
                continue
            batch = decode_entries(msg.value() or b"", headers_of(msg))
            assert batch is not None
            counts.update((batch.topic, batch.partition, e.offset) for e in batch.entries)
    consumer.close()
    return counts


def test_each_record_reaches_a_read_committed_consumer_once_journaled_in_its_transaction(
    setup: Setup, bridges: list[Bridge]
) -> None:
    bridge = setup.bridge(**EXACTLY_ONCE)
    bridges.append(bridge.start())
    assert wait_ready(bridge)
    expected = schedule(setup, 200, seed=57, max_delay_ms=2000)
    collector = setup.collector()
    try:
        each_once(collector, setup, expected, timeout=60)
    finally:
        collector.close()
    assert metric(bridge, 'delay_bridge_transactions_total{result="committed"}') >= 1
    assert metric(bridge, 'delay_bridge_transactions_total{result="aborted"}') == 0
    entries = journaled(setup.services.bootstrap, setup.journal)
    assert len(entries) == 200 and max(entries.values()) == 1
    assert bridge.stop() == 0


def test_records_delivered_exactly_once_leave_no_garbage_for_the_collector(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A record's way through its shard's transaction holds no reference cycle, so the cycle
    collector finds nothing to do (as at-least-once: test_pipeline's test of it). Its produce
    fields once held its delivery report's callback, which held the record: every record was
    garbage for the collector, whose collections held the interpreter 100-200 ms at a time at
    3,667 records/s, and records fell due that late (docs/bench/history.md)."""
    bridge = setup.bridge(**EXACTLY_ONCE)
    bridges.append(bridge.start())
    assert wait_ready(bridge)
    before = cycle_collector(bridge)
    expected = schedule(setup, 20_000, seed=59, max_delay_ms=2000)
    collector = setup.collector()
    try:
        each_once(collector, setup, expected, timeout=120)
    finally:
        collector.close()
    assert_no_garbage_since(bridge, before, "20,000 records")


def test_a_crash_in_the_midst_of_deliveries_duplicates_nothing(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """SIGKILL while records fall due: what the dead replica committed and had not acknowledged
    in Redis is found in the journal by the next owner, what it left open is aborted."""
    first = fast_takeover(setup, "first", **EXACTLY_ONCE)
    bridges.append(first)
    assert wait_ready(first)
    expected = schedule(setup, 3000, seed=58, max_delay_ms=5000)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 1000, 60, "a third of the records")
        first.kill()
        second = fast_takeover(setup, "second", **EXACTLY_ONCE)
        bridges.append(second)
        each_once(collector, setup, expected, timeout=90)
    finally:
        collector.close()


def test_a_frozen_replica_that_wakes_after_its_partitions_moved_cannot_commit(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A replica stopped (SIGSTOP) with a transaction open, past its session: the partitions'
    next owner fences it and aborts what it left open; woken (SIGCONT), its commits fail and it
    delivers nothing more of them."""
    frozen = fast_takeover(setup, "frozen", egress__transaction="1s", **EXACTLY_ONCE)
    bridges.append(frozen)
    assert wait_ready(frozen)
    expected = schedule(setup, 1500, seed=59, max_delay_ms=6000)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 300, 60, "the first records")
        assert frozen.proc is not None
        frozen.signal(signal.SIGSTOP)
        try:
            other = fast_takeover(setup, "other", **EXACTLY_ONCE)
            bridges.append(other)
            wait_for(
                lambda: metric(other, "delay_bridge_delivered_total") > 0,
                60,
                "the next owner delivers",
            )
        finally:
            frozen.signal(signal.SIGCONT)
        wait_for(
            lambda: metric(frozen, 'delay_bridge_transactions_total{result="fenced"}') >= 1,
            60,
            "the woken replica fenced",
        )
        each_once(collector, setup, expected, timeout=120)
    finally:
        collector.close()


def test_redis_wiped_in_the_midst_of_deliveries_duplicates_nothing(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Redis loses every key while records fall due: the rebuild leaves out what the journal
    holds as committed, and what is in flight here is the same record as its copy read again
    from the delay topic. Within two seconds of the start, before any offset is
    committed: the partitions are read again from where their logs start, with the journal
    (they were read as new, the journal not consulted: 1,395 duplicates)."""
    bridge = setup.bridge(**EXACTLY_ONCE)
    bridges.append(bridge.start())
    assert wait_ready(bridge)
    expected = schedule(setup, 3000, seed=60, max_delay_ms=5000)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 1000, 60, "a third of the records")
        assert wipe(setup) > 0
        each_once(collector, setup, expected, timeout=90)
    finally:
        collector.close()


def test_a_rebuild_whose_journal_cannot_be_read_yet_duplicates_nothing(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Redis loses every key while no bridge runs, once the records were delivered, and the
    journal cannot be read for the rebuild at first (injected: its first three reads fail, as a
    journal partition without a leader longer than the reader waits): the next bridge stored
    again what the journal holds as delivered, and delivered it again ("journal not read for the
    re-read …"). Exactly once, a partition is not read again before the journal is."""
    first = setup.bridge("first", **EXACTLY_ONCE)
    bridges.append(first.start())
    assert wait_ready(first)
    target = setup.targets[0].encode()
    pin: ToPartition = [(0, b"pin", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")])]
    produce_to(setup.services.bootstrap, setup.delay, pin)  # the rebuild point: offset 0
    expected = schedule(setup, 300, seed=61, max_delay_ms=1000)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= len(expected), 60, "every record")
        wait_for(lambda: metric(first, "delay_bridge_journal_pending") == 0, 30, "all journaled")
        first.signal(signal.SIGTERM)
        assert first.wait(30) == 0
        assert wipe(setup) > 0
        again = setup.bridge("again", **EXACTLY_ONCE)
        again.env = with_faults(again.env, JOURNAL_FATES_FAIL="3")
        bridges.append(again.start())
        now: ToPartition = [(0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms")])]
        produce_to(setup.services.bootstrap, setup.delay, now)
        collector.until(lambda rs: any(r.value == b"after" for r in rs), 60, "the next record")
        collector.poll(2.0)
    finally:
        collector.close()
    counts = collections.Counter(r.value for r in collector.records)
    twice = sorted(v or b"" for v, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} delivered again, e.g. {twice[:3]}"
    assert "nothing is stored or claimed until the journal can be read" in again.output()


def test_readyz_names_a_partition_whose_transactional_producer_cannot_start(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Kafka refuses the producers' transaction timeout (above the broker's
    transaction.max.timeout.ms, 15 min): no partition is delivered, and /readyz says which
    producer and why."""
    config = setup.tmp / "too-long.yaml"
    config.write_text("kafka:\n  producer: {transaction.timeout.ms: '1000000'}\n")
    bridge = setup.bridge(**EXACTLY_ONCE)
    bridge.env["DELAY_BRIDGE_CONFIG"] = str(config)
    bridges.append(bridge.start())
    body = ""

    def named() -> bool:
        nonlocal body
        status, body = bridge.get("/readyz")
        return status == 503 and "transactional producer did not start" in body

    wait_for(named, 60, "/readyz naming the producer")
    assert f"{setup.delay}[" in body and "timeout" in body.lower()
    assert metric(bridge, "delay_bridge_delivered_total") == 0


def test_a_burst_with_long_ids_commits_with_its_whole_journal(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """6,000 records with 64-byte ids due at once in one partition, transactions gathering for
    1 s: one transaction took them all, and its journal record (1.3 MB) was refused at once by
    the producer (message.max.bytes 1 MB) — the transaction committed without it, so a rebuild or
    a take-over would deliver them again. Transactions hold 5,000 records at most and a journal
    record 256 KB: each record is delivered once and journaled once."""
    bridge = setup.bridge(egress__transaction="1s", **EXACTLY_ONCE)
    bridges.append(bridge.start())
    assert wait_ready(bridge)
    target = setup.targets[0].encode()
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            (
                b"one-partition",
                b"burst-%d" % i,
                [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms"), (H_ID, b"%064d" % i)],
            )
            for i in range(6000)
        ],
    )
    wait_for(lambda: metric(bridge, "delay_bridge_delivered_total") == 6000, 120, "all delivered")
    wait_for(
        lambda: metric(bridge, "delay_bridge_journal_written_total") >= 6000, 30, "all journaled"
    )
    assert metric(bridge, "delay_bridge_journal_failures_total") == 0
    counts = journaled(setup.services.bootstrap, setup.journal)
    assert len(counts) == 6000 and set(counts.values()) == {1}


def test_a_partition_whose_producer_cannot_start_holds_up_that_partition_alone(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Partition 1's transactional producer does not start (injected: as an ACL refusing its
    transactional id would). The whole mover step failed with it, every try, so no partition was
    delivered. Now partition 1 waits, named in /readyz, and the others are delivered."""
    bridge = setup.bridge(**EXACTLY_ONCE)
    bridge.env = with_faults(bridge.env, TXN_FAULT_PARTITION="1")
    bridges.append(bridge.start())
    expected = [v for v in setup.due_now_in((0, 1, 2), 5) if not v.startswith(b"p1-")]
    assert setup.await_values(10, 60, "partitions 0 and 2 delivered") == expected
    status, body = bridge.get("/readyz")
    assert status == 503 and f"{setup.delay}[1]" in body, body
    assert "injected by the test" in body and f"{setup.delay}[0]" not in body, body


def test_acknowledgements_redis_lost_without_its_watermark_going_back_deliver_nothing_again(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Redis is put back to where it was after 20 records were stored and before any was
    delivered, as a failover to a replica that missed only the acknowledgements does: the
    watermark did not go back, so no rebuild reads the journal; the 20 are back, waiting or
    leased. The mover claims them again, and knows it committed them: none is delivered twice
    (without that: every one of them)."""
    # Lost leases show in 3 s (claims ahead at most a tenth of it).
    bridge = setup.bridge(egress__lease="3s", egress__ahead="300ms", **EXACTLY_ONCE).start()
    bridges.append(bridge)
    assert wait_ready(bridge)
    target = setup.targets[0].encode()

    def record(i: int) -> tuple[bytes, bytes, Headers]:
        headers: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"4s")]
        own = [(H_ID, b"r-%d" % i)] if i % 2 else []  # half claimed ahead, half when due
        return b"one-partition", b"first-%d" % i, headers + own

    produce_all(setup.services.bootstrap, setup.delay, [record(i) for i in range(20)])
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") >= 20, 30, "the 20 stored")
    snapshot = snapshot_keys(setup)
    wait_for(lambda: metric(bridge, "delay_bridge_delivered_total") >= 20, 60, "the 20 delivered")
    roll_back(setup, snapshot)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 20, 60, "the 20 deliveries")
        collector.poll(6.0)  # anything delivered again: at once, or when a lost lease expires
    finally:
        collector.close()
    counts = collections.Counter(r.value for r in collector.records)
    assert len(counts) == 20 and max(counts.values()) == 1, {
        v: n for v, n in counts.items() if n > 1
    }
    assert "redis lost" not in bridge.output()  # no rebuild: the mover alone saw to it


def test_a_rebuild_after_a_kill_mid_commit_reads_the_journal_at_once(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A replica delivers records, stalls in its third transaction's commit (its journal entries
    at the broker, the commit not sent) and is SIGKILLed; Redis loses everything before the next
    one starts. That one's rebuild reads the journal for what was settled, but the transaction
    left open in it (Kafka aborts it when the partition's producer starts again, or after
    egress.lease) held the read back until it gave up: everything delivered before was delivered
    again (the exactly-once recurring test: one occurrence of every schedule of a partition
    twice). The earlier owner is now fenced before the read."""
    first = setup.bridge("first", **EXACTLY_ONCE, egress__lease="60s")
    first.env = with_faults(first.env, JOURNAL_HANG_AFTER="3")
    first = with_session_timeout(setup, first, "6000", "1000").start()
    bridges.append(first)
    assert wait_ready(first)
    target = setup.targets[0].encode()
    key = b"one-partition"
    start = time.time_ns() // 1_000_000 + 1000
    records = [
        (key, b"r-%d" % i, [(H_TARGET_TOPIC, target), (H_DELIVER_AT, b"%d" % (start + 20 * i))])
        for i in range(100)
    ]
    produce_all(setup.services.bootstrap, setup.delay, records)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 2, 60, "two transactions committed")
        wait_for(
            lambda: metric(first, "delay_bridge_oldest_inflight_seconds") > 2,
            30,
            "the third stalled in its commit",
        )
        first.kill()
        assert wipe(setup) > 0
        again = fast_takeover(setup, "again", **EXACTLY_ONCE)
        bridges.append(again)
        collector.until(lambda rs: len(rs) >= 100, 90, "all 100")
        collector.poll(2.0)  # anything more would be a duplicate
    finally:
        collector.close()
    counts = collections.Counter(r.value for r in collector.records)
    assert max(counts.values()) == 1, {v: n for v, n in counts.items() if n > 1}
    assert "journal not read" not in again.output(), again.output()[-2000:]
