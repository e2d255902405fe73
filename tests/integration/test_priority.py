"""Priority lanes in the real Redis: among due records high goes first, then normal, then low;
never early; cancels, replacements, references and put-backs find a record in its lane; what the
gauges and the operator commands read."""

from __future__ import annotations

import time

import pytest

from bridge.client import partition_for
from bridge.egress.lanes import Lanes
from bridge.egress.plan import Plan
from bridge.message import H_DELIVER_AT, H_PRIORITY, H_TARGET_TOPIC, Cancel, Priority, Scheduled
from bridge.store import Shard, Store, offset_bytes, score
from bridge.store.ids import id_hash, read_index
from bridge.store.keys import member
from testbed.harness import Bridge, Collector, Setup, metric, produce_all
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
LEASE = 30_000
SHARD = Shard("delay", 0)
HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW


def rec(
    offset: int, due: int, priority: Priority = NORMAL, delay_id: str = "", value: bytes = b"v"
) -> Scheduled:
    return Scheduled(
        offset,
        due,
        "out",
        b"k",
        value,
        [("h", b"1")],
        delay_id or f"delay:0:{offset}",
        priority=priority,
    )


def add(
    store: Store, *records: Scheduled | Cancel, shard: Shard = SHARD, refer_after: int | None = None
) -> None:
    top = max(r.offset for r in records)
    store.add({shard: (top, list(records))}, refer_after_ms=refer_after, bucket_ms=60_000)


def claim(store: Store, now: int, limit: int = 100, **kw: object) -> list[tuple[int, Priority]]:
    got = store.claim([SHARD], limit, LEASE, now_ms=now, **kw)  # type: ignore[arg-type]
    return [(c.record.offset, c.record.priority) for c in got]


def test_among_due_records_high_goes_first_then_normal_then_low(store: Store) -> None:
    # Interleaved, and the low and normal ones due earlier than the high ones.
    add(
        store,
        rec(0, T0 - 3000, LOW),
        rec(1, T0 - 2000, NORMAL),
        rec(2, T0 - 1000, HIGH),
        rec(3, T0 - 3000, LOW),
        rec(4, T0 - 500, HIGH),
        rec(5, T0 - 2000, NORMAL),
        rec(6, T0 - 500, HIGH),
    )
    assert claim(store, T0, limit=3) == [(2, HIGH), (4, HIGH), (6, HIGH)]
    assert claim(store, T0, limit=3) == [(1, NORMAL), (5, NORMAL), (0, LOW)]
    assert claim(store, T0) == [(3, LOW)]


def test_priority_never_makes_a_record_early(store: Store) -> None:
    add(store, rec(0, T0, LOW), rec(1, T0 + 1, HIGH), rec(2, T0 + 1, NORMAL))
    assert claim(store, T0 - 1) == []
    assert claim(store, T0) == [(0, LOW)]  # the high one is not due yet
    assert claim(store, T0 + 1) == [(1, HIGH), (2, NORMAL)]


def test_within_a_lane_due_order_then_offset_order(store: Store) -> None:
    add(store, *(rec(i, T0 - 10 * (i % 3), HIGH) for i in range(9)))
    assert [o for o, _ in claim(store, T0)] == [2, 5, 8, 1, 4, 7, 0, 3, 6]


def test_the_on_time_half_holds_within_a_lane(store: Store) -> None:
    # An overdue backlog of high records does not hold up the high records falling due now.
    add(store, *(rec(i, T0 - 60_000, HIGH) for i in range(10)), rec(10, T0, HIGH), rec(11, T0, LOW))
    assert [o for o, _ in claim(store, T0, limit=4)] == [0, 1, 2, 10]


def test_a_claim_cut_at_a_priority_says_what_is_still_due(store: Store) -> None:
    add(store, rec(0, T0, LOW), rec(1, T0, NORMAL), rec(2, T0, HIGH), rec(3, T0 + 5, HIGH))
    got = store.claim([SHARD], 10, LEASE, now_ms=T0, lanes={SHARD: HIGH})
    assert [c.record.offset for c in got] == [2]
    assert got.due_lanes == {SHARD: frozenset({NORMAL, LOW})}
    assert got.next_ms[SHARD] == T0  # records are due: the mover's plan sees it
    got = store.claim([SHARD], 10, LEASE, now_ms=T0, lanes={SHARD: NORMAL})
    assert ([c.record.offset for c in got], got.due_lanes) == ([1], {SHARD: frozenset({LOW})})
    got = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert ([c.record.offset for c in got], got.due_lanes, got.next_ms[SHARD]) == ([0], {}, T0 + 5)


def test_cancel_and_replace_find_a_record_in_any_lane(store: Store) -> None:
    add(store, rec(0, T0, HIGH, "a"), rec(1, T0, LOW, "b"), rec(2, T0, NORMAL, "c"))
    added = store.add({SHARD: (4, [Cancel(3, "a"), rec(4, T0 + 1, NORMAL, "b", b"new")])})
    assert (added.cancelled, added.replaced, added.not_found) == (1, 1, 0)
    assert claim(store, T0 + 1) == [(2, NORMAL), (4, NORMAL)]
    assert not store.inventory.is_pending(SHARD, 0) and not store.inventory.is_pending(SHARD, 1)


def test_a_reference_read_back_into_its_lane_is_still_reached_by_a_cancel(store: Store) -> None:
    far = T0 + 3_600_000
    high = rec(0, far, HIGH, "a")
    add(store, high, rec(1, far, LOW, "b"), refer_after=T0)
    while chunks := store.references.due([SHARD], far):
        for chunk in chunks:
            records = {0: high, 1: rec(1, far, LOW, "b")}
            members = [
                (score(records[o]), member(records[o], "delay", 0)) for o, _ in chunk.references()
            ]
            assert store.references.promote(chunk, members) == 2
    # The id index holds the due ms, not the lane: a cancel looks in each.
    entries = read_index(store.client.hgetall(store.keys(SHARD).ids))  # type: ignore[arg-type]
    assert [(o, due) for h, o, due in entries if h == id_hash("delay", "a")] == [
        (offset_bytes(0), far)
    ]
    added = store.add({SHARD: (2, [Cancel(2, "a")])})
    assert added.cancelled == 1
    assert store.references.counts([SHARD]) == {SHARD: 0}  # not mistaken for a reference
    assert claim(store, far) == [(1, LOW)]


def test_a_record_put_back_returns_to_its_lane(store: Store) -> None:
    add(store, rec(0, T0, LOW), rec(1, T0, HIGH))
    claimed = store.claim([SHARD], 10, LEASE, now_ms=T0)
    assert store.unclaim(claimed) == 2
    assert claim(store, T0) == [(1, HIGH), (0, LOW)]


def test_records_claimed_ahead_come_from_every_lane_once_nothing_is_due(store: Store) -> None:
    add(
        store,
        rec(0, T0 + 50, LOW),
        rec(1, T0 + 60, HIGH),
        rec(2, T0 + 70, NORMAL, "own-id"),
        rec(3, T0 + 500, HIGH),
    )
    # Ahead 100 ms: the default-id ones due by then; the one with its own id waits for its time.
    assert sorted(claim(store, T0, ahead_ms=100)) == [(0, LOW), (1, HIGH)]
    assert claim(store, T0 + 70) == [(2, NORMAL)]


def test_once_the_high_records_are_claimed_normal_ones_are_claimed_ahead_again(
    store: Store,
) -> None:
    """The mover claims a lane ahead only while no higher one is due within the window
    (Lanes.ahead): it reads each lane's earliest due time from the ingress's notice and then from
    every claim's reply, so once the high record is claimed, normal ones are claimed ahead again."""
    lanes = Lanes(set)
    add(store, rec(0, T0 + 50, HIGH), rec(1, T0 + 300, NORMAL))
    lanes.stored({SHARD: (T0 + 50, T0 + 300, -1)})
    assert lanes.ahead([SHARD], T0 + 1000) is HIGH
    lanes.claimed(store.claim([SHARD], 10, LEASE, now_ms=T0 + 50), Plan(0, 0))
    # Normal records go ahead again; low ones wait while the normal one is due in the window.
    assert lanes.ahead([SHARD], T0 + 1000) is NORMAL


def test_the_backlog_counts_overdue_records_by_priority(store: Store) -> None:
    add(
        store,
        rec(0, T0 - 10, HIGH),
        rec(1, T0 - 10, LOW),
        rec(2, T0 - 20, LOW),
        rec(3, T0 + 10, HIGH),
    )
    backlog = store.backlog([SHARD], now_ms=T0)
    assert (backlog.scheduled, backlog.overdue, backlog.oldest_due_ms) == (1, 3, T0 - 20)
    assert backlog.overdue_by == {HIGH: 1, NORMAL: 0, LOW: 2}


def test_the_operator_reads_list_every_lane_in_due_order(store: Store) -> None:
    add(store, rec(0, T0 + 30, HIGH), rec(1, T0 + 10, LOW), rec(2, T0 + 20, NORMAL, "x"))
    page = store.inventory.page(SHARD, None, 10)
    assert [due for due, _ in page] == [T0 + 10, T0 + 20, T0 + 30]
    assert [due for due, _ in store.inventory.page(SHARD, T0 + 30, 10)] == [T0 + 10, T0 + 20]
    assert store.inventory.first(SHARD) == T0 + 10
    assert [due for due, _ in store.inventory.at(SHARD, T0 + 30, offset_bytes(0))] == [T0 + 30]


def _keys_by_partition(partitions: int) -> dict[int, list[bytes]]:
    """Record keys that Kafka's default partitioner sends to each partition."""
    keys: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for i in range(10_000):
        key = b"k-%d" % i
        keys[partition_for(key, partitions)].append(key)
    return keys


def test_a_backlog_drains_high_first_across_partitions(setup: Setup, bridges: list[Bridge]) -> None:
    """Records stored by a running bridge, all falling due at one instant: partition 0 holds only
    low records, partition 1 high and normal ones, partition 2 all three, interleaved. They go to
    one target partition, whose offsets are the order Kafka appended them in: every high record
    before the first normal one, every normal before the first low — though the claims of the
    three shards are made side by side, each takes only a batch, and partition 0 has nothing but
    low records to give."""
    target = setup.targets[1]  # one partition
    keys = _keys_by_partition(3)
    mix = {0: [LOW] * 1200, 1: [HIGH, NORMAL] * 400, 2: [HIGH, NORMAL, LOW] * 300}
    bridge = setup.bridge(egress__batch_size="200").start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    due = str(time.time_ns() // 1_000_000 + 6000).encode()  # time to store them all first
    records = []
    for partition, priorities in mix.items():
        for i, priority in enumerate(priorities):
            headers = [
                (H_TARGET_TOPIC, target.encode()),
                (H_DELIVER_AT, due),
                (H_PRIORITY, priority.label.encode()),
            ]
            records.append((keys[partition][i % 50], priority.label.encode(), headers))
    produce_all(setup.services.bootstrap, setup.delay, records)
    wait_for(
        lambda: metric(bridge, "delay_bridge_ingested_total") == len(records),
        30,
        "every record stored",
    )
    assert time.time_ns() // 1_000_000 < int(due), "stored after they fell due: the test is void"
    collector = Collector(setup.services.bootstrap, [target], f"check-{setup.unique}")
    try:
        collector.until(lambda rs: len(rs) >= len(records), 120, "every record delivered")
    finally:
        collector.close()
    order = [r.value for r in sorted(collector.records, key=lambda r: r.offset)]
    assert len(order) == len(records)  # none twice
    last = {name: max(i for i, v in enumerate(order) if v == name) for name in (b"high", b"normal")}
    first = {name: order.index(name) for name in (b"normal", b"low")}
    assert last[b"high"] < first[b"normal"] and last[b"normal"] < first[b"low"], (last, first)


def test_a_rate_limited_drain_keeps_the_rate_and_stays_ready(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """egress.max_rate 300/s: 900 records due at once drain in about 3 s, not at full speed, with
    /readyz 200 throughout (a limit working as configured is no fault) and what waited counted."""
    target = setup.targets[0]
    due = str(time.time_ns() // 1_000_000).encode()
    records = [
        (b"k%d" % i, b"v%d" % i, [(H_TARGET_TOPIC, target.encode()), (H_DELIVER_AT, due)])
        for i in range(900)
    ]
    bridge = setup.bridge(egress__max_rate="300").start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    collector = Collector(setup.services.bootstrap, [target], f"check-{setup.unique}")
    try:
        produce_all(setup.services.bootstrap, setup.delay, records)
        collector.until(lambda rs: len(rs) >= 1, 60, "the first delivery")
        first = time.monotonic()
        deadline = first + 60
        while len(collector.records) < len(records):  # polling the target, with a deadline
            assert time.monotonic() < deadline, f"{len(collector.records)} of 900 delivered"
            status, body = bridge.get("/readyz")
            assert status == 200, body
            collector.poll()
        took = time.monotonic() - first
    finally:
        collector.close()
    # 900 at 300/s: 3 s less the first tenth of a second's burst; never at full speed (well
    # under 0.5 s for 900 records here).
    assert took >= 2.0, f"drained in {took:.2f} s"
    assert metric(bridge, "delay_bridge_rate_limited_total") > 0
