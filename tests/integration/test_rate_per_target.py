"""egress.max_rate_per_target in the real Redis and a real bridge: a target's records beyond its
rate wait in its own wait index — where they hold up no other target's records, leave priority
first, a cancel reaches them, the gauges and `list` count them and a retire keeps them — and a
bridge delivers the other targets at once while the limited one gets its rate."""

from __future__ import annotations

import time

import pytest

from bridge.message import H_DELIVER_AT, H_TARGET_TOPIC, Cancel, Priority, Scheduled
from bridge.store import AckBatch, Claims, Shard, Store
from testbed.harness import Bridge, Collector, Setup, metric, produce_all
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
LEASE = 30_000
SHARD = Shard("delay", 0)
HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW


def to(
    target: str, offset: int, due: int, priority: Priority = NORMAL, delay_id: str = ""
) -> Scheduled:
    return Scheduled(
        offset, due, target, b"k", b"v", [], delay_id or f"delay:0:{offset}", priority=priority
    )


def add(store: Store, *records: Scheduled | Cancel, shard: Shard = SHARD) -> None:
    store.add({shard: (max(r.offset for r in records), list(records))})


def offsets(claims: Claims) -> list[int]:
    return [c.record.offset for c in claims]


def set_aside(store: Store, target: str, shard: Shard = SHARD) -> int:
    """Claim every due record of ``shard`` and set ``target``'s aside to wait for its rate."""
    claimed = store.claim([shard], 100, LEASE, now_ms=T0)
    return store.unclaim([c for c in claimed if c.record.target == target], wait=True)


def test_records_set_aside_for_a_rate_are_claimed_from_their_wait_index_priority_first(
    store: Store,
) -> None:
    add(
        store,
        to("slow", 0, T0 - 30, LOW),
        to("slow", 1, T0 - 20),
        to("slow", 2, T0 - 10, HIGH),
        to("fast", 3, T0 - 40),
    )
    assert set_aside(store, "slow") == 3
    assert store.inventory.waits([SHARD]) == {SHARD: {"slow"}}
    # They no longer stand in the due index: a record due after them is the next one claimed.
    add(store, to("fast", 4, T0 - 5))
    assert offsets(store.claim([SHARD], 10, LEASE, now_ms=T0)) == [4]
    waiting = [
        store.claim_waiting({(SHARD, "slow"): 1}, LEASE, now_ms=T0)["slow"] for _ in range(3)
    ]
    assert [offsets(c) for c in waiting] == [[2], [1], [0]]
    assert waiting[0].due_lanes == {SHARD: frozenset({NORMAL, LOW})}
    assert store.inventory.waits([SHARD]) == {}  # claimed empty: the index is gone
    assert store.claim_waiting({(SHARD, "slow"): 1}, LEASE, now_ms=T0)["slow"] == []


def test_a_claim_from_a_wait_index_takes_no_record_before_its_time(store: Store) -> None:
    add(store, to("slow", 0, T0 + 50))
    claimed = store.claim([SHARD], 10, LEASE, now_ms=T0, ahead_ms=100)  # claimed ahead
    assert store.unclaim(claimed, wait=True) == 1
    assert store.claim_waiting({(SHARD, "slow"): 10}, LEASE, now_ms=T0 + 49)["slow"] == []
    assert offsets(store.claim_waiting({(SHARD, "slow"): 10}, LEASE, now_ms=T0 + 50)["slow"]) == [0]


def test_a_cancel_reaches_a_record_waiting_for_its_targets_rate(store: Store) -> None:
    add(store, to("slow", 0, T0 - 10, HIGH, delay_id="order-1"), to("slow", 1, T0 - 10))
    assert set_aside(store, "slow") == 2
    added = store.add({SHARD: (2, [Cancel(2, "order-1")])})
    assert (added.cancelled, added.not_found) == (1, 0)
    assert not store.inventory.is_pending(SHARD, 0) and store.inventory.is_pending(SHARD, 1)
    assert offsets(store.claim_waiting({(SHARD, "slow"): 10}, LEASE, now_ms=T0)["slow"]) == [1]
    # The last one withdrawn empties the index, and the waits SET forgets the target.
    add(store, to("slow", 3, T0 - 5, delay_id="order-2"))
    assert set_aside(store, "slow") == 1
    assert store.add({SHARD: (4, [Cancel(4, "order-2")])}).cancelled == 1
    assert store.inventory.waits([SHARD]) == {}


def test_the_gauges_and_list_count_the_records_waiting_for_a_rate(store: Store) -> None:
    add(store, to("slow", 0, T0 - 20, HIGH), to("slow", 1, T0 - 10), to("fast", 2, T0 + 1000))
    assert set_aside(store, "slow") == 2
    backlog = store.backlog([SHARD], now_ms=T0)
    assert (backlog.scheduled, backlog.overdue, backlog.oldest_due_ms) == (1, 2, T0 - 20)
    assert backlog.overdue_by == {HIGH: 1, NORMAL: 1, LOW: 0}
    assert [due for due, _ in store.inventory.page(SHARD)] == [T0 - 20, T0 - 10, T0 + 1000]
    assert store.inventory.first(SHARD) == T0 - 20
    assert store.inventory.stored_bytes([SHARD])["full"] > 0


def test_a_retired_incarnation_keeps_what_waits_for_a_rate(store: Store) -> None:
    add(store, to("slow", 0, T0 - 10))
    assert set_aside(store, "slow") == 1
    bound = store.layout.bind({SHARD: "topic-id-2"}, force=[SHARD])[SHARD]
    retired = bound.retired
    assert retired is not None and bound.records == 1
    assert store.inventory.waits([SHARD, retired]) == {retired: {"slow"}}
    assert not store.layout.forget_retired(retired), "forgotten while a record waits for its rate"
    claims = store.claim_waiting({(retired, "slow"): 10}, LEASE, now_ms=T0)["slow"]
    assert offsets(claims) == [0]
    store.ack({retired: AckBatch(claims[0].epoch, [claims[0].member])})
    assert store.layout.forget_retired(retired)


def test_a_rate_limited_target_holds_up_no_other_target(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """egress.max_rate_per_target {slow: 200}: 600 records for it due first, 300 for another
    target due after them, all overdue: the other target's are delivered at once, the slow one's
    over about 3 s; /readyz 200 throughout; what waited for the rate counted once each."""
    slow, fast = setup.targets
    config = setup.tmp / "bridge.yaml"  # a mapping, which the environment cannot set
    config.write_text(f"egress:\n  max_rate_per_target: {{{slow}: 200}}\n")
    bridge = setup.bridge()
    bridge.env["DELAY_BRIDGE_CONFIG"] = str(config)
    bridges.append(bridge.start())
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    now = time.time_ns() // 1_000_000
    records = [
        (
            b"s%d" % i,
            b"slow",
            [(H_TARGET_TOPIC, slow.encode()), (H_DELIVER_AT, b"%d" % (now - 2000))],
        )
        for i in range(600)
    ]
    records += [
        (
            b"f%d" % i,
            b"fast",
            [(H_TARGET_TOPIC, fast.encode()), (H_DELIVER_AT, b"%d" % (now - 1000))],
        )
        for i in range(300)
    ]
    collector = Collector(setup.services.bootstrap, [slow, fast], f"check-{setup.unique}")
    try:
        produce_all(setup.services.bootstrap, setup.delay, records)
        # and a first slow one: the collector may fetch one topic's records before the other's
        collector.until(
            lambda rs: (
                sum(r.value == b"fast" for r in rs) >= 300 and any(r.value == b"slow" for r in rs)
            ),
            30,
            "the fast ones",
        )
        first_slow = min(r.timestamp_ms for r in collector.records if r.value == b"slow")
        slow_by_then = sum(r.value == b"slow" for r in collector.records)
        deadline = time.monotonic() + 60
        while sum(r.value == b"slow" for r in collector.records) < 600:  # with a deadline
            assert time.monotonic() < deadline, "the slow target's records not all delivered"
            status, body = bridge.get("/readyz")
            assert status == 200, body
            collector.poll()
    finally:
        collector.close()
    assert slow_by_then < 400, f"{slow_by_then} slow records before the last fast one"
    last_slow = max(r.timestamp_ms for r in collector.records if r.value == b"slow")
    # 600 at 200/s: 3 s less the first tenth of a second's burst.
    assert last_slow - first_slow >= 2500, f"slow drained in {last_slow - first_slow} ms"
    assert len(collector.records) == 900  # none twice
    waited = metric(bridge, f'delay_bridge_rate_limited_total{{target_topic="{slow}"}}')
    assert 400 <= waited <= 600, waited


def test_records_waiting_for_their_rate_outlive_a_sigkill(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A bridge SIGKILLed while a limited target's records wait for its rate: the next one finds
    them in the wait indexes of the partitions it takes over and delivers every one."""
    slow = setup.targets[0]
    config = setup.tmp / "bridge.yaml"
    config.write_text(f"egress:\n  max_rate_per_target: {{{slow}: 100}}\n")
    # One static group member, started again: it takes its partitions back at once.
    first = setup.bridge("first", kafka__group_instance_id="pod-0")
    first.env["DELAY_BRIDGE_CONFIG"] = str(config)
    bridges.append(first.start())
    wait_for(lambda: first.get("/readyz")[0] == 200, 60, "ready")
    due = b"%d" % (time.time_ns() // 1_000_000)
    values = {b"v%d" % i for i in range(400)}
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            (b"k%d" % i, b"v%d" % i, [(H_TARGET_TOPIC, slow.encode()), (H_DELIVER_AT, due)])
            for i in range(400)
        ],
    )
    collector = Collector(setup.services.bootstrap, [slow], f"check-{setup.unique}")
    try:
        collector.until(lambda rs: len(rs) >= 50, 30, "the first records")
        waited = metric(first, f'delay_bridge_rate_limited_total{{target_topic="{slow}"}}')
        first.kill()
        assert waited >= 200, f"only {waited} records waited for the rate: the test is void"
        second = setup.bridge("second", kafka__group_instance_id="pod-0")
        second.env["DELAY_BRIDGE_CONFIG"] = str(config)
        bridges.append(second.start())
        collector.until(lambda rs: {r.value for r in rs} >= values, 60, "every record")
    finally:
        collector.close()
