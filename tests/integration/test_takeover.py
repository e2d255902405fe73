"""Recovery after a crash: a restarted replica keeps its partitions (static membership) and takes
back the leases its previous life held at once, instead of waiting for them to expire."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import redis
from confluent_kafka.admin import AdminClient

from bridge.message import H_AFTER, H_TARGET_TOPIC, Headers
from bridge.store import Shard, Store
from testbed.harness import (
    Bridge,
    Setup,
    metric,
    produce_all,
    with_faults,
    with_session_timeout,
)
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

LONG_LEASE = "90s"  # far longer than any wait below: a record delivered in time was taken back
LONG_SESSION = "30000"  # a dynamic member replacing a dead one waits this long
# A static member of the bridge's group that crashes as soon as a cooperative rebalance has it
# give up a partition: after that first step and before it rejoins for the second.
CRASHES_GIVING_UP = """
import os, sys
from confluent_kafka import Consumer
bootstrap, group, instance, topic = sys.argv[1:]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "group.instance.id": instance, "session.timeout.ms": "30000",
                     "partition.assignment.strategy": "cooperative-sticky"})
def revoked(_consumer, partitions):
    if partitions:
        os._exit(0)
consumer.subscribe([topic], on_revoke=revoked)
while True:
    consumer.poll(0.1)
"""


def ready(bridge: Bridge, timeout: float = 60) -> None:
    wait_for(lambda: bridge.get("/readyz")[0] == 200, timeout, "/readyz 200")


def records_due_in(setup: Setup, count: int, delay_ms: int, tag: str) -> int:
    """Produce ``count`` records due ``delay_ms`` from now; returns the earliest due time."""
    due = time.time_ns() // 1_000_000 + delay_ms
    headers: Headers = [
        (H_TARGET_TOPIC, setup.targets[0].encode()),
        (H_AFTER, f"{delay_ms}ms".encode()),
    ]
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [(f"k{i}".encode(), f"{tag}-{i}".encode(), headers) for i in range(count)],
    )
    return due


def test_leases_a_dead_replica_held_are_taken_back_at_assignment(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Records claimed by a replica that died before delivering them (leases of 90 s) are
    delivered by the next owner of their partitions at once, and not before they are due."""
    bridge = setup.bridge(egress__lease=LONG_LEASE)
    bridges.append(bridge.start())
    ready(bridge)
    due = records_due_in(setup, 30, 2000, "held")
    client = redis.Redis.from_url(setup.services.redis_url)
    store = Store(client, f"test-{setup.unique}")
    shards = [Shard(setup.delay, p) for p in range(3)]
    try:
        wait_for(lambda: store.backlog(shards).scheduled == 30, 30, "30 records stored")
        assert bridge.stop() == 0
        wait_for(lambda: store.time_ms() >= due + 100, 10, "the records fall due")
        # What the dead replica held: every record claimed under a 90 s lease, never acknowledged.
        held = store.claim(shards, 100, 90_000)
        assert len(held) == 30
        restarted = setup.bridge("again", egress__lease=LONG_LEASE)
        bridges.append(restarted.start())
        started = time.monotonic()
        collector = setup.collector()
        try:
            collector.until(lambda rs: len(rs) >= 30, 30, "the held records")
        finally:
            collector.close()
        assert time.monotonic() - started < 30  # not after the 90 s lease
        assert {r.value for r in collector.records} == {b"held-%d" % i for i in range(30)}
        assert all(r.timestamp_ms >= due for r in collector.records)
    finally:
        client.close()


def test_a_replica_restarted_after_a_crash_gets_its_partitions_back_at_once(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """With kafka.group_instance_id the restarted process is the same group member: its
    partitions come back without waiting for the dead one's session (30 s here) to end."""
    bridge = with_session_timeout(
        setup, setup.bridge(kafka__group_instance_id="pod-0"), LONG_SESSION
    )
    bridges.append(bridge.start())
    ready(bridge)
    bridge.kill()
    again = with_session_timeout(
        setup, setup.bridge("again", kafka__group_instance_id="pod-0"), LONG_SESSION
    )
    bridges.append(again.start())
    started = time.monotonic()
    records_due_in(setup, 9, 0, "after-restart")
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 9, 20, "records after the restart")
    finally:
        collector.close()
    assert time.monotonic() - started < 20  # the dead member's session would be 30 s
    assert "assigned" in again.output()


def test_a_replica_stopped_for_good_hands_its_partitions_on_at_once(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """By default a replica is a static member the bridge names after its host and port (so an
    outage or a crash does not cost a session), and it leaves the group when it stops: a
    Deployment's rollout or a scale-down hands its partitions on in one rebalance, not after its
    session (30 s here)."""
    first = with_session_timeout(setup, setup.bridge("first"), LONG_SESSION)
    second = with_session_timeout(setup, setup.bridge("second"), LONG_SESSION)
    bridges += [first.start(), second.start()]
    ready(first)
    ready(second)
    wait_for(
        lambda: (
            metric(first, "delay_bridge_owned_partitions") >= 1
            and metric(second, "delay_bridge_owned_partitions") >= 1
        ),
        60,
        "both own some",
    )
    assert " as instance " in first.output()  # static: named by the bridge
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    stopped = time.monotonic()
    wait_for(
        lambda: metric(second, "delay_bridge_owned_partitions") == 3,
        25,
        "the other replica owning every partition",
    )
    assert time.monotonic() - stopped < 10  # a member that stayed would hold them 30 s


def owners(admin: AdminClient, group: str) -> dict[str, list[int]]:
    """Group instance id -> the partitions Kafka has it own ({} while the group rebalances)."""
    description = admin.describe_consumer_groups([group])[group].result(10)
    if description.state.name != "STABLE":
        return {}
    return {
        m.group_instance_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
        for m in description.members
    }


def test_a_partition_given_up_by_a_member_that_crashed_before_it_rejoined_is_owned_again(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A cooperative rebalance moves a partition in two steps: its owner gives it up, then
    rejoins, and the next assignment gives it to another member. A static member that crashes
    between the two and is restarted under its instance id gets its old assignment back without
    a rebalance (Kafka's rule for a static member rejoining a stable group): the partition it
    gave up is nobody's, and its records wait for a rebalance that may never come. The bridges
    see a stable group leave a partition unowned and have one member rejoin."""
    group, bootstrap = f"bridge-{setup.unique}", setup.services.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    crashing = subprocess.Popen(
        [sys.executable, "-c", CRASHES_GIVING_UP, bootstrap, group, "pod-0", setup.delay]
    )
    try:
        wait_for(lambda: owners(admin, group) == {"pod-0": [0, 1, 2]}, 60, "pod-0 owning all")
        joining = setup.bridge("pod-1", kafka__group_instance_id="pod-1")
        bridges.append(joining.start())
        assert crashing.wait(60) == 0, "pod-0 did not give up a partition"
    finally:
        crashing.kill()
    restarted = setup.bridge("pod-0", kafka__group_instance_id="pod-0")
    bridges.append(restarted.start())  # within pod-0's session: the same member, no rebalance
    wait_for(lambda: "assigned" in restarted.output(), 60, "the restarted pod-0 assigned")
    unowned = owners(admin, group)
    assert unowned and sum(map(len, unowned.values())) < 3, f"nothing left unowned: {unowned}"
    due = records_due_in(setup, 30, 0, "unowned")  # keys k0..k29: every partition has some
    collector = setup.collector()
    try:
        collector.until(lambda rs: len({r.value for r in rs}) >= 30, 60, "every record")
    finally:
        collector.close()
    assert {r.value for r in collector.records} == {b"unowned-%d" % i for i in range(30)}
    assert all(r.timestamp_ms >= due for r in collector.records)
    assert sorted(p for ps in owners(admin, group).values() for p in ps) == [0, 1, 2]
    said = joining.output() + restarted.output()
    assert "owned by no member" in said


def test_a_partition_the_mover_was_never_handed_is_delivered_from_after_a_while(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """The consumer is assigned partition 1 and the mover is not told (injected: a bug in the
    hand-over, as when a producer fenced by this replica's own dropped a partition the group had
    just assigned it again): its records were stored and never delivered, and no other replica
    could but for the unowned watch's one rejoin of the group (bridge.ingress.unowned, after 15 s),
    which gives up once a rejoin moved nothing. The probes see the partition assigned and not
    delivered from, log it as an error and take it over again (after 2 s here; DRIFT_S, 30 s, in
    production), with no rejoin."""
    bridge = setup.bridge()
    bridge.env = with_faults(bridge.env, OWNED_DROP_PARTITION="1", OWNED_DRIFT_S="2")
    bridges.append(bridge.start())
    expected = setup.due_now_in((0, 1, 2), 5)
    assert setup.await_values(15, 60, "every partition delivered") == expected
    logged = bridge.output()
    assert f"{setup.delay}[1] assigned to this replica's consumer and not delivered" in logged
    assert "leaving the group and joining it again" not in logged
