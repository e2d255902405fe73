"""limits.max_waiting_per_target on the real servers: a target's records past its quota reach the
DLQ as quota-exceeded, another target's are stored, and what a cancel frees is taken again."""

from __future__ import annotations

import pytest

from bridge.message import H_AFTER, H_CANCEL, H_ERROR, H_ERROR_DETAIL, H_ID, H_TARGET_TOPIC
from testbed.harness import Bridge, Setup, metric, produce_all, wipe
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

QUOTA = 50


def _waiting(bridge: Bridge, target: str) -> float:
    return metric(bridge, f'delay_bridge_waiting_messages{{target_topic="{target}"}}')


def _started(bridges: list[Bridge], setup: Setup, quotas: str) -> Bridge:
    """A bridge of ``setup`` with ``quotas`` as limits.max_waiting_per_target (a mapping, which
    the environment cannot set), ready."""
    path = setup.tmp / "bridge.yaml"
    path.write_text(f"limits:\n  max_waiting_per_target: {quotas}\n")
    bridge = setup.bridge()
    bridge.env["DELAY_BRIDGE_CONFIG"] = str(path)
    bridges.append(bridge.start())
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    return bridge


def _number(delay_id: bytes | None) -> int:
    return int((delay_id or b"").decode().rsplit("-", 1)[1])


def test_records_past_their_targets_quota_are_dead_lettered_and_a_cancel_frees_room(
    one: Setup, bridges: list[Bridge]
) -> None:
    """Quota 50 for one target (by a pattern), none for the other: of 80 records for the first,
    the first 50 are stored and the last 30 dead-lettered as quota-exceeded; the other target's 30
    are all stored. At the quota, a record replacing a waiting one by its delay-id is stored and a
    new one is refused; after 10 cancels, 10 new records are stored and the 11th is refused. The
    gauges count what waits, per target, and the quota."""
    limited, free = one.targets[0], f"{one.targets[0]}-free"
    bridge = _started(bridges, one, f'{{"{limited.replace(".", "[.]")}": {QUOTA}}}')
    later = b"10m"  # waiting whole (within store.payload_horizon) for the whole test

    def record(target: str, delay_id: str, value: bytes = b"v") -> tuple[bytes, bytes, list]:  # type: ignore[type-arg]
        headers = [(H_TARGET_TOPIC, target.encode()), (H_AFTER, later), (H_ID, delay_id.encode())]
        return (b"k", value, headers)

    produce_all(
        one.services.bootstrap,
        one.delay,
        [record(limited, f"a-{i}") for i in range(80)]
        + [record(free, f"b-{i}") for i in range(30)],
    )
    collector = one.collector()
    try:
        collector.until(lambda rs: len(rs) >= 30, 60, "30 dead letters")
        wait_for(lambda: _waiting(bridge, free) == 30, 30, "the free target's 30 counted")
        assert _waiting(bridge, limited) == QUOTA
        dead = collector.of(one.dlq)
        assert sorted(_number(r.header(H_ID)) for r in dead) == list(range(50, 80))
        for r in dead:
            assert r.header(H_ERROR) == b"quota-exceeded"
            detail = (r.header(H_ERROR_DETAIL) or b"").decode()
            assert f"{limited!r} has 50 records waiting; its quota is 50" in detail, detail
        quota = metric(bridge, f'delay_bridge_waiting_quota_messages{{target_topic="{limited}"}}')
        assert quota == QUOTA
        assert f'quota_messages{{target_topic="{free}"}}' not in bridge.get("/metrics")[1]

        # At the quota: a replacement of a waiting record is stored, a new record is not.
        produce_all(
            one.services.bootstrap,
            one.delay,
            [record(limited, "a-0", b"replaced"), record(limited, "a-new")],
        )
        collector.until(lambda rs: len(rs) >= 31, 60, "the new one dead-lettered")
        assert [r.header(H_ID) for r in collector.of(one.dlq)][30:] == [b"a-new"]

        # 10 cancels free 10 places: 10 new records are stored, the 11th is refused.
        cancels = [(b"k", None, [(H_CANCEL, f"a-{i}".encode())]) for i in range(1, 11)]
        produce_all(one.services.bootstrap, one.delay, cancels)
        wait_for(lambda: _waiting(bridge, limited) == QUOTA - 10, 30, "the cancels applied")
        produce_all(
            one.services.bootstrap, one.delay, [record(limited, f"c-{i}") for i in range(11)]
        )
        collector.until(lambda rs: len(rs) >= 32, 60, "the 11th dead-lettered")
        wait_for(lambda: _waiting(bridge, limited) == QUOTA, 30, "10 new ones stored")
        collector.poll(1.0)  # another dead letter would show up now
    finally:
        collector.close()
    assert [r.header(H_ID) for r in collector.of(one.dlq)][31:] == [b"c-10"]
    assert len(collector.of(one.dlq)) == 32
    assert not [r for r in collector.records if r.topic != one.dlq]  # nothing due yet
    assert metric(bridge, 'delay_bridge_dead_lettered_total{reason="quota-exceeded"}') == 32


def test_a_target_without_a_quota_is_never_refused(one: Setup, bridges: list[Bridge]) -> None:
    """A quota for another target's pattern leaves this one's records alone, however many."""
    target = one.targets[0]
    bridge = _started(bridges, one, '{"other[.].*": 1}')
    produce_all(
        one.services.bootstrap,
        one.delay,
        [
            (b"k", b"%d" % i, [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"0ms")])
            for i in range(300)
        ],
    )
    collector = one.collector()
    try:
        collector.until(lambda rs: len(rs) >= 300, 60, "all 300 delivered")
        collector.poll(1.0)
    finally:
        collector.close()
    assert sorted(int(r.value or b"-1") for r in collector.of(target)) == list(range(300))
    assert collector.of(one.dlq) == []
    # Acknowledged (the egress names their targets): none is counted any more.
    wait_for(lambda: _waiting(bridge, target) == 0, 30, "the count back to 0")


def test_a_rebuild_refuses_nothing_it_stored_before(setup: Setup, bridges: list[Bridge]) -> None:
    """Quota 60. Offset 0 waits and pins the committed offset; 50 records due at once are
    delivered (and journaled); then 49 more wait: 50 waiting, all stored. Redis loses everything:
    the rebuild re-reads from offset 0. The 50 delivered are left out by the journal — and were
    judged first, counting against the quota as if stored again: 40 of the waiting ones went to
    the DLQ as quota-exceeded."""
    target = setup.targets[0]
    bridge = _started(bridges, setup, f'{{"{target}": 60}}')
    key = b"one-partition"  # all in one partition, so offset 0 holds its commit back

    def record(value: bytes, after: bytes) -> tuple[bytes, bytes, list]:  # type: ignore[type-arg]
        return (key, value, [(H_TARGET_TOPIC, target.encode()), (H_AFTER, after)])

    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [record(b"waits", b"10m")] + [record(b"now-%d" % i, b"0ms") for i in range(50)],
    )
    wait_for(
        lambda: metric(bridge, "delay_bridge_journal_written_total") >= 50,
        60,
        "the 50 delivered and journaled",
    )
    produce_all(
        setup.services.bootstrap, setup.delay, [record(b"later-%d" % i, b"10m") for i in range(49)]
    )
    wait_for(lambda: _waiting(bridge, target) == 50, 30, "50 waiting")
    assert wipe(setup) > 0
    wait_for(
        lambda: "the journal holds the fate of 50 records since" in bridge.output(),
        60,
        "the rebuild",
    )
    wait_for(lambda: _waiting(bridge, target) == 50, 30, "50 waiting again")
    collector = setup.collector()
    try:
        collector.poll(2.0)  # a dead letter would show up now
    finally:
        collector.close()
    assert collector.of(setup.dlq) == []
    assert metric(bridge, 'delay_bridge_dead_lettered_total{reason="quota-exceeded"}') == 0


def test_a_quota_holds_exactly_over_thousands_of_records_on_every_partition(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Quota 5,000 over three partitions: of 8,000 records for the target, produced at once and
    ingested in many batches, exactly 5,000 are stored and 3,000 dead-lettered, each record one
    or the other; 1,000 for another target are all stored."""
    limited, other = setup.targets
    bridge = _started(bridges, setup, f'{{"{limited}": 5000}}')

    def record(target: str, i: int) -> tuple[bytes, bytes, list]:  # type: ignore[type-arg]
        return (b"k%d" % i, b"%d" % i, [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"10m")])

    records = [record(limited, i) for i in range(8000)]
    records += [record(other, i) for i in range(1000)]
    produce_all(setup.services.bootstrap, setup.delay, records)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 3000, 120, "3,000 dead letters")
        wait_for(lambda: _waiting(bridge, other) == 1000, 30, "the other target's 1,000")
        wait_for(lambda: _waiting(bridge, limited) == 5000, 30, "5,000 waiting")
        collector.poll(1.0)  # another dead letter would show up now
    finally:
        collector.close()
    dead = [int(r.value or b"-1") for r in collector.of(setup.dlq)]
    assert len(dead) == len(set(dead)) == 3000
    assert all(r.header(H_ERROR) == b"quota-exceeded" for r in collector.of(setup.dlq))
    assert all(r.header(H_TARGET_TOPIC) == limited.encode() for r in collector.of(setup.dlq))
    assert metric(bridge, "delay_bridge_scheduled_messages") == 6000
