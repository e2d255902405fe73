"""A partition rebuilt while cancels, replacements and a schedule's next occurrences are read
beside it, on one bridge and across two replicas: what the journal settled stays settled, and what
an operator or a producer withdrew stays withdrawn."""

from __future__ import annotations

import signal
import time
from typing import cast

import pytest
import redis
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bridge.journal import (
    Entry,
    Fate,
    encode_entries,
)
from bridge.kafka import produce
from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_CONTINUES,
    H_DELIVER_AT,
    H_EVERY,
    H_ID,
    H_PRODUCED,
    H_REPLACES,
    H_TARGET_TOPIC,
    Headers,
)
from bridge.positions import commit_of
from bridge.store import Shard
from bridge.store.keys import Keys
from testbed.harness import (
    Bridge,
    Setup,
    metric,
    produce_to,
    wipe,
    with_faults,
    with_session_timeout,
)
from tests.conftest import wait_for
from tests.integration.test_journal import counts_through
from tests.integration.test_recovery import committed

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["cancel", "replacement"])
def test_a_cancel_read_while_its_records_partition_is_rebuilt_still_withdraws_it(
    setup: Setup, bridges: list[Bridge], kind: str
) -> None:
    """A record with its own id waits in partition 2 behind 20,000 others. Redis loses
    everything, and a cancel of the record is produced to partition 0 at once: its add finds
    partition 0's state gone and rebuilds it within milliseconds, while partition 2's loss is
    found at the next second's check and its re-read reaches the record after 20,000 more. The
    cancel, read first, found nothing, and the record came back to be delivered (the adversary,
    seed 4 with a Redis loss: a schedule cancelled from another partition went on; 2 runs in 3
    on that code). The cancel is kept, and looks again once the partitions of its topic are
    whole in Redis again. So is a record replacing it by its id: both were delivered before."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()
    later: list[tuple[int, bytes | None, Headers]] = [
        (2, b"filler", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]) for _ in range(20_000)
    ]
    later.append((2, b"cancelled", [(H_TARGET_TOPIC, target), (H_AFTER, b"15s"), (H_ID, b"o")]))
    produce_to(setup.services.bootstrap, setup.delay, later)
    wait_for(
        lambda: metric(bridge, "delay_bridge_ingested_total") >= 20_001, 60, "the 20,001 stored"
    )
    assert wipe(setup) > 0
    if kind == "cancel":
        withdraws: Headers = [(H_CANCEL, b"o")]
    else:
        withdraws = [(H_TARGET_TOPIC, target), (H_AFTER, b"15s"), (H_ID, b"o")]
    produce_to(setup.services.bootstrap, setup.delay, [(0, b"replacement", withdraws)])
    after: list[tuple[int, bytes | None, Headers]] = [
        (2, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"16s")])
    ]
    produce_to(setup.services.bootstrap, setup.delay, after)
    counts = counts_through(setup, b"after", 90)
    assert b"cancelled" not in counts, bridge.output()[-3000:]
    assert counts[b"replacement"] == (kind == "replacement")


def test_a_cancel_read_while_another_replicas_partition_is_rebuilt_still_withdraws_it(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Two replicas. A record with its own id waits in partition 2 behind 20,000 others; Redis
    loses everything, and partition 2's owner reads it again (20 records a batch: some seconds).
    Meanwhile a cancel of the record is read by the other replica, in a partition it owns: it
    knows partition 2 only by what Redis says of it, and found nothing there, so the cancel was
    done with and the re-read brought the record back to be delivered. Redis says the partition
    is read again (meta "reread"): the cancel is kept until the re-read passes its end."""
    slow = {"ingress__batch_size": "20"}
    pair = [setup.bridge("one", **slow).start(), setup.bridge("two", **slow).start()]
    bridges.extend(pair)
    wait_for(
        lambda: all(metric(b, "delay_bridge_owned_partitions") > 0 for b in pair), 90, "both own"
    )
    target = setup.targets[0].encode()
    later: list[tuple[int, bytes | None, Headers]] = [
        (2, b"filler", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]) for _ in range(20_000)
    ]
    # Due in 40 s: the re-read (1,000 batches) ends before it on a machine running make test's
    # three lanes (13 s once); one ending after the due time races the kept cancel (the owner
    # claims the record as it catches up).
    later.append((2, b"cancelled", [(H_TARGET_TOPIC, target), (H_AFTER, b"40s"), (H_ID, b"o")]))
    produce_to(setup.services.bootstrap, setup.delay, later)

    def ingested() -> list[float]:
        return [metric(b, "delay_bridge_ingested_total") for b in pair]

    wait_for(lambda: max(ingested()) >= 20_001, 90, "the 20,001 stored")
    owner = ingested().index(max(ingested()))
    other = pair[1 - owner]
    mine = next(  # a partition the other replica owns: a record produced there, stored by it
        p for p in (0, 1) if _stored_by(setup, pair, p, other)
    )
    meta = Keys(f"test-{setup.unique}").of(Shard(setup.delay, 2)).meta
    client = redis.Redis.from_url(setup.services.redis_url)
    try:
        assert wipe(setup) > 0
        wait_for(lambda: _field(client, meta, "reread") is not None, 30, "partition 2 read again")
        produce_to(setup.services.bootstrap, setup.delay, [(mine, None, [(H_CANCEL, b"o")])])
        wait_for(
            lambda: (
                metric(other, "delay_bridge_cancels_kept") == 1
                or _field(client, meta, "reread") is None
            ),
            30,
            "the cancel read",
        )
    finally:
        client.close()
    after: list[tuple[int, bytes | None, Headers]] = [
        (2, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"41s")])
    ]
    produce_to(setup.services.bootstrap, setup.delay, after)
    counts = counts_through(setup, b"after", 90)
    assert b"cancelled" not in counts, other.output()[-3000:]


def test_a_cancel_kept_while_its_records_partition_catches_up_wins_over_later_records(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """One replica, stopped. Meanwhile partition 2 gets 500 records and then one with its own id
    due 3 s later, partition 0 that record's cancel, and, once the record fell due, partition 2
    200 records more. The bridge starts and catches up, 10 records a batch: it reads the cancel
    first and finds nothing (partition 2 is not read up to the record yet), so it keeps it until
    partition 2 is whole; partition 2's records stamped after the due time let its catch-up
    claim the record on the way, before the cancel looked again. The cancel was read before the
    record was claimed: it wins. A catch-up claims nothing due after a cancel kept in its topic
    was stamped, and is held as it ends until the cancel looked."""
    first = setup.bridge("first", ingress__batch_size="10").start()
    bridges.append(first)
    wait_for(lambda: first.get("/readyz")[0] == 200, 60, "ready")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    target = setup.targets[0].encode()
    hour: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]
    produce_to(setup.services.bootstrap, setup.delay, [(2, b"filler", hour)] * 500)
    due_ms = int(time.time() * 1000) + 3000
    record: Headers = [(H_TARGET_TOPIC, target), (H_DELIVER_AT, b"%d" % due_ms), (H_ID, b"o")]
    produce_to(setup.services.bootstrap, setup.delay, [(2, b"cancelled", record)])
    produce_to(setup.services.bootstrap, setup.delay, [(0, None, [(H_CANCEL, b"o")])])
    assert time.time() * 1000 < due_ms - 1000, "the cancel produced late: the machine is slow"
    wait_for(lambda: time.time() * 1000 > due_ms + 200, 10, "the due time")
    now: Headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"0s")]
    produce_to(
        setup.services.bootstrap, setup.delay, [*[(2, b"filler", hour)] * 200, (2, b"after", now)]
    )
    second = setup.bridge("second", ingress__batch_size="10").start()
    bridges.append(second)
    counts = counts_through(setup, b"after", 90)
    assert b"cancelled" not in counts, second.output()[-3000:]


@pytest.mark.parametrize("read_past", [False, True], ids=["at-its-end", "mid-way"])
def test_a_kept_cancel_wins_over_a_record_that_fell_due_while_its_partition_was_read_again(
    setup: Setup, bridges: list[Bridge], read_past: bool
) -> None:
    """The scene before, with the record falling due while its partition is read again (each
    add of the re-read 300 ms late: a fault hook, as a slow Redis would make it): the owner may
    claim it only once the re-read is over, and the other replica's kept cancel looks again
    only then too (once a second). The owner waits for the cancels kept in the topic's other
    partitions to look again before it claims: the cancel, read seconds before the due time,
    withdraws the record. ``read_past``: the re-read reads a record stamped after the due time
    before it ends (200 more follow it), which would let it claim the record mid-way; it claims
    nothing due after the earliest cancel the other replica keeps in the topic."""
    slow = {"ingress__batch_size": "10"}
    pair = [setup.bridge("one", **slow), setup.bridge("two", **slow)]
    for bridge in pair:
        bridge.env = with_faults(bridge.env, SLOW_REREAD_MS="300")
        bridges.append(bridge.start())
    wait_for(
        lambda: all(metric(b, "delay_bridge_owned_partitions") > 0 for b in pair), 90, "both own"
    )
    target = setup.targets[0].encode()
    due_ms = int(time.time() * 1000) + 10_000  # mid-way through the re-read (40 adds: 12 s)
    later: list[tuple[int, bytes | None, Headers]] = [
        (2, b"filler", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]) for _ in range(400)
    ]
    at = b"%d" % due_ms
    later.append((2, b"cancelled", [(H_TARGET_TOPIC, target), (H_DELIVER_AT, at), (H_ID, b"o")]))
    produce_to(setup.services.bootstrap, setup.delay, later)
    if read_past:
        stamped = Producer({"bootstrap.servers": setup.services.bootstrap})
        headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]
        produce(
            stamped,
            setup.delay,
            partition=2,
            key=b"k",
            value=b"filler",
            headers=headers,
            timestamp=due_ms + 1_000,
        )
        assert stamped.flush(30) == 0
        produce_to(setup.services.bootstrap, setup.delay, later[:200])

    def ingested() -> list[float]:
        return [metric(b, "delay_bridge_ingested_total") for b in pair]

    stored = 602 if read_past else 401
    wait_for(lambda: max(ingested()) >= stored, 30, f"the {stored} stored")
    other = pair[1 - ingested().index(max(ingested()))]
    mine = next(p for p in (0, 1) if _stored_by(setup, pair, p, other))
    meta = Keys(f"test-{setup.unique}").of(Shard(setup.delay, 2)).meta
    client = redis.Redis.from_url(setup.services.redis_url)
    try:
        assert wipe(setup) > 0
        wait_for(lambda: _field(client, meta, "reread") is not None, 30, "partition 2 read again")
        produce_to(setup.services.bootstrap, setup.delay, [(mine, None, [(H_CANCEL, b"o")])])
        kept = "delay_bridge_cancels_kept"
        wait_for(lambda: metric(other, kept) == 1, 30, "the cancel read, kept")
        assert time.time() * 1000 < due_ms - 1000, "the cancel kept late: the machine is slow"
        wait_for(lambda: time.time() * 1000 > due_ms, 15, "the due time")
        assert _field(client, meta, "reread") is not None, "the re-read ended before the due time"
    finally:
        client.close()
    after: list[tuple[int, bytes | None, Headers]] = [
        (2, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"0s")])
    ]
    produce_to(setup.services.bootstrap, setup.delay, after)
    counts = counts_through(setup, b"after", 90)
    assert b"cancelled" not in counts, other.output()[-3000:]
    said = "keep cancels or replacements that wait for this re-read to end"
    assert any(said in b.output() for b in pair), "the re-read's wait not logged"


def test_a_cancel_read_before_another_replica_finds_its_partition_lost_still_withdraws_it(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Two replicas. A record with its own id waits in partition 2; Redis loses everything while
    partition 2's owner is frozen (SIGSTOP, shorter than its session), so Redis has no word of
    partition 2 at all — not even that it is read again. A cancel of the record is read by the
    other replica meanwhile, in a partition it owns. Partition 2 looked like one that never had
    a record, the cancel was done with, and the owner, back, rebuilt the record and delivered
    it. The partition's log holds records, so its lost state is waited for: the cancel is kept
    until the owner has read it again, and withdraws the record."""
    pair = [setup.bridge("one").start(), setup.bridge("two").start()]
    bridges.extend(pair)
    wait_for(
        lambda: all(metric(b, "delay_bridge_owned_partitions") > 0 for b in pair), 90, "both own"
    )
    target = setup.targets[0].encode()
    owner = next(b for b in pair if _stored_by(setup, pair, 2, b))
    other = pair[1 - pair.index(owner)]
    mine = next(p for p in (0, 1) if _stored_by(setup, pair, p, other))
    cancelled: list[tuple[int, bytes | None, Headers]] = [
        (2, b"cancelled", [(H_TARGET_TOPIC, target), (H_AFTER, b"15s"), (H_ID, b"o")])
    ]
    produce_to(setup.services.bootstrap, setup.delay, cancelled)
    wait_for(lambda: metric(owner, "delay_bridge_ingested_total") >= 2, 30, "the record stored")
    not_found = 'delay_bridge_cancelled_total{result="not-found"}'
    owner.signal(signal.SIGSTOP)
    try:
        assert wipe(setup) > 0
        produce_to(setup.services.bootstrap, setup.delay, [(mine, None, [(H_CANCEL, b"o")])])
        wait_for(
            lambda: metric(other, "delay_bridge_cancels_kept") == 1 or metric(other, not_found) > 0,
            15,  # within the frozen owner's session (20 s): its partitions stay its own
            "the cancel read",
        )
    finally:
        owner.signal(signal.SIGCONT)
    after: list[tuple[int, bytes | None, Headers]] = [
        (2, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"16s")])
    ]
    produce_to(setup.services.bootstrap, setup.delay, after)
    counts = counts_through(setup, b"after", 90)
    assert b"cancelled" not in counts, other.output()[-3000:]
    assert metric(other, not_found) == 0
    assert metric(other, 'delay_bridge_cancelled_total{result="cancelled"}') == 1
    assert metric(other, "delay_bridge_cancels_kept") == 0


def test_a_rebuild_cut_short_by_a_sigkill_goes_on_with_the_journal_after_the_restart(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Redis loses everything; the bridge reads partition 0 again from its rebuild point,
    leaving out what the journal says was delivered, and is SIGKILLed part-way (20 records a
    batch, 20,000 waiting ahead of the 100 delivered). The group's commit is at the re-read's
    position, as an owner's that committed there leaves it. The next owner resumes from what
    Redis holds, which the re-read left (meta "reread"): it goes on as a re-read, with the
    journal, and the 100 are not delivered again. Resumed as a plain read (Redis and the
    commit agreeing), each was delivered twice."""
    slow = {"ingress__batch_size": "20"}
    first = with_session_timeout(setup, setup.bridge(**slow), "6000", "1000").start()
    bridges.append(first)
    wait_for(lambda: first.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()
    waiting: list[tuple[int, bytes | None, Headers]] = [
        (0, b"waits", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]) for _ in range(20_000)
    ]
    due: list[tuple[int, bytes | None, Headers]] = [
        (0, b"due-%d" % i, [(H_TARGET_TOPIC, target), (H_AFTER, b"2s")]) for i in range(100)
    ]
    produce_to(setup.services.bootstrap, setup.delay, [*waiting, *due])
    assert all(n == 1 for n in counts_through(setup, b"due-99", 60).values() if n)
    wait_for(lambda: metric(first, "delay_bridge_journal_written_total") >= 100, 30, "journaled")
    meta = Keys(f"test-{setup.unique}").of(Shard(setup.delay, 0)).meta
    client = redis.Redis.from_url(setup.services.redis_url)
    try:
        assert wipe(setup) > 0
        wait_for(
            lambda: (
                _field(client, meta, "reread") is not None
                and int(_field(client, meta, "ingested") or -1) >= 100
            ),
            30,
            "partition 0 read again part-way",
        )
        first.kill()
        mark = int(_field(client, meta, "ingested") or -1)
        assert mark < 20_000 and _field(client, meta, "reread") is not None
    finally:
        client.close()
    group = Consumer(
        {"bootstrap.servers": setup.services.bootstrap, "group.id": f"bridge-{setup.unique}"}
    )
    try:  # once the killed member's session is over, the group is empty and takes it
        wait_for(
            lambda: _committed_at(group, commit_of(Shard(setup.delay, 0), mark + 1, 0)),
            30,
            "the commit at the re-read's position",
        )
    finally:
        group.close()
    again = setup.bridge(**slow).start()
    bridges.append(again)
    after: list[tuple[int, bytes | None, Headers]] = [
        (0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"1s")])
    ]
    produce_to(setup.services.bootstrap, setup.delay, after)
    counts = counts_through(setup, b"after", 120)
    twice = [v for v, n in counts.items() if v and v.startswith(b"due-") and n > 1]
    assert not twice, again.output()[-3000:]


def _committed_at(group: Consumer, tp: TopicPartition) -> bool:
    """Commit ``tp`` for the group; whether Kafka took it (not while a member holds it)."""
    try:
        group.commit(offsets=[tp], asynchronous=False)
    except KafkaException:
        return False
    return True


def _fired_copy(setup: Setup, offset: int, after: bytes) -> tuple[int, bytes | None, Headers]:
    """``b"the copy"``: the command line's ``fire`` of partition 0's record at ``offset`` (its
    default id as the copy's, and the record it replaces exactly), due ``after`` it is read."""
    named = f"{setup.delay}:0:{offset}".encode()
    target = setup.targets[0].encode()
    headers: Headers = [
        (H_TARGET_TOPIC, target),
        (H_AFTER, after),
        (H_ID, named),
        (H_REPLACES, named),
    ]
    return 0, b"the copy", headers


def test_a_copy_whose_record_was_delivered_before_it_came_stays_out_of_a_rebuild(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """An operator fired a record (``delay-bridge fire``: a copy due now that replaces exactly
    the record at its origin) just after the record was delivered: the copy came too late, and is
    not stored. Redis loses everything; the rebuild starts past the record (the rebuild point
    is a later record still waiting), so Redis cannot know the copy came too late — the journal
    does, and the copy stays out. Stored, it was delivered: twice what the operator fired once."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()
    first: list[tuple[int, bytes | None, Headers]] = [
        (0, b"fired", [(H_TARGET_TOPIC, target), (H_AFTER, b"1s")]),
        (0, b"pin", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]),  # the rebuild point
    ]
    produce_to(setup.services.bootstrap, setup.delay, first)
    assert counts_through(setup, b"fired", 60)[b"fired"] == 1
    wait_for(lambda: committed(setup)[1] == 1, 30, "the rebuild point past the delivered record")
    copy: list[tuple[int, bytes | None, Headers]] = [
        _fired_copy(setup, 0, b"1s"),
        (0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"2s")]),
    ]
    produce_to(setup.services.bootstrap, setup.delay, copy)
    assert b"the copy" not in counts_through(setup, b"after", 60)  # too late: not stored
    wait_for(lambda: committed(setup)[0] == 4, 30, "the copy and the marker committed")
    assert wipe(setup) > 0
    wait_for(lambda: metric(bridge, "delay_bridge_rebuilds_total") >= 1, 30, "the rebuild")
    marker: list[tuple[int, bytes | None, Headers]] = [
        (0, b"after the rebuild", [(H_TARGET_TOPIC, target), (H_AFTER, b"2s")])
    ]
    produce_to(setup.services.bootstrap, setup.delay, marker)
    counts = counts_through(setup, b"after the rebuild", 60)
    assert b"the copy" not in counts, bridge.output()[-3000:]
    assert counts[b"fired"] == counts[b"after"] == 1


@pytest.mark.parametrize("by", ["fire", "id"])
def test_a_copy_that_was_delivered_still_replaces_its_record_in_a_rebuild_that_reads_it_back(
    setup: Setup, bridges: list[Bridge], by: str
) -> None:
    """An operator fired a record (a copy due now that replaces exactly the record at its
    origin): the copy withdrew the record and was delivered. The record's withdrawal never
    reached the journal — the process was SIGKILLed between add.lua and the journal's write (the
    adversary with references, seed 4: the operator's bulk fire, then the fault at once) — and
    Redis then lost everything. The rebuild reads the record again, with no fate in the journal,
    and leaves the copy out (the journal holds it delivered): the record was stored again and
    delivered at its due time, twice what the operator fired once. A copy stored at all replaced
    its record then: the rebuild withdraws it again. So for a record with a caller's delay-id
    replaced by the next record with that id (``id``): the old version was delivered after the
    new one."""
    bridge = setup.bridge()
    bridge.env = with_faults(bridge.env, JOURNAL_LOSE_WITHDRAWN="1")
    bridges.append(bridge.start())
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()
    due = time.time_ns() // 1_000_000 + 8_000
    own: Headers = [(H_ID, b"order-1")] if by == "id" else []
    first: list[tuple[int, bytes | None, Headers]] = [
        (0, b"pin", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]),  # the rebuild point
        (0, b"fired", [(H_TARGET_TOPIC, target), (H_DELIVER_AT, b"%d" % due), *own]),
    ]
    produce_to(setup.services.bootstrap, setup.delay, first)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 2, 30, "the two stored")
    copy = _fired_copy(setup, 1, b"0ms")
    if by == "id":
        copy = (0, b"the copy", [(H_TARGET_TOPIC, target), (H_AFTER, b"0ms"), *own])
    produce_to(setup.services.bootstrap, setup.delay, [copy])
    assert counts_through(setup, b"the copy", 30)[b"the copy"] == 1
    wait_for(
        lambda: (
            metric(bridge, "delay_bridge_delivered_total") >= 1
            and metric(bridge, "delay_bridge_journal_pending") == 0
        ),
        30,
        "the copy's delivery journaled",
    )
    assert wipe(setup) > 0
    wait_for(lambda: metric(bridge, "delay_bridge_rebuilds_total") >= 1, 30, "the rebuild")
    marker: list[tuple[int, bytes | None, Headers]] = [
        (0, b"after", [(H_TARGET_TOPIC, target), (H_DELIVER_AT, b"%d" % (due + 2000))])
    ]
    produce_to(setup.services.bootstrap, setup.delay, marker)
    counts = counts_through(setup, b"after", 60)
    assert b"fired" not in counts, bridge.output()[-3000:]
    assert counts[b"the copy"] == 1


def test_a_partition_read_again_up_to_a_transactions_marker_says_so_in_redis_when_it_ends(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Partition 0 ends with a transaction's commit marker (the egress writes the records that
    carry schedules on so, exactly once): no record sits at its last offset. Redis loses
    everything; the bridge reads the partition again up to that end and says so in Redis (meta
    "reread", which other replicas' cancels wait for). Reaching the end, the re-read is over
    there too — with no record after it, the field stayed, and the other replicas' cancels
    waited on it until the partition's next record."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()
    pin: tuple[int, bytes | None, Headers] = (
        0,
        b"pin",
        [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")],
    )
    produce_to(setup.services.bootstrap, setup.delay, [pin])  # the rebuild point
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the pin stored")
    producer = Producer(
        {"bootstrap.servers": setup.services.bootstrap, "transactional.id": f"t-{setup.unique}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(20):
        headers = [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]
        produce(producer, setup.delay, partition=0, value=b"in a transaction", headers=headers)
    producer.commit_transaction(30)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 21, 30, "the 21 stored")
    meta = Keys(f"test-{setup.unique}").of(Shard(setup.delay, 0)).meta
    client = redis.Redis.from_url(setup.services.redis_url)
    try:
        assert wipe(setup) > 0
        wait_for(lambda: _field(client, meta, "ingested") == b"20", 30, "read again to its end")
        wait_for(lambda: _field(client, meta, "reread") is None, 10, "the re-read over in Redis")
    finally:
        client.close()


def _field(client: redis.Redis, key: str, field: str) -> bytes | None:
    """A HASH field's value (None: none)."""
    return cast(bytes | None, client.hget(key, field))


def _stored_by(setup: Setup, pair: list[Bridge], partition: int, which: Bridge) -> bool:
    """Whether a record produced to ``partition`` (due in an hour) is stored by ``which``."""
    before = [metric(b, "delay_bridge_ingested_total") for b in pair]
    target = setup.targets[0].encode()
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [(partition, b"probe", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")])],
    )
    wait_for(
        lambda: sum(metric(b, "delay_bridge_ingested_total") for b in pair) > sum(before),
        30,
        "the probe stored",
    )
    return metric(which, "delay_bridge_ingested_total") > before[pair.index(which)]


def _a_step_journaled(
    setup: Setup, bridges: list[Bridge], pinned: bool = True
) -> tuple[Headers, int]:
    """A bridge stores, in partition 0, a record waiting an hour (its commit's rebuild point) and
    at offset 1 a schedule "poll" (every hour), and stops; then the journal says the schedule's
    step at offset 1 was delivered. Not ``pinned``: the schedule alone, at offset 0. Returns the
    schedule's headers and when it was produced."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    target = setup.targets[0].encode()
    now = int(time.time() * 1000)
    every: Headers = [(H_TARGET_TOPIC, target), (H_EVERY, b"1h"), (H_ID, b"poll")]
    pin: list[tuple[int, bytes | None, Headers]] = [
        (0, b"pin", [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")])
    ]
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [*(pin if pinned else []), (0, b"poll", [*every, (H_AFTER, b"1h")])],
    )
    stored = 2 if pinned else 1
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == stored, 30, "stored")
    bridge.signal(signal.SIGTERM)
    assert bridge.wait(30) == 0
    producer = Producer(  # the journal's partitioner: its entries where the bridge reads them
        {"bootstrap.servers": setup.services.bootstrap, "partitioner": "murmur2_random"}
    )
    delivered = Entry(Fate.DELIVERED, stored - 1, "poll", now, now, setup.targets[0], 0, 0)
    key, value, headers = encode_entries(setup.delay, 0, [delivered], "")
    produce(producer, setup.journal, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0
    return every, now


def _carried_on(every: Headers, produced_ms: int, due_ms: int) -> Headers:
    """The headers of the record carrying the schedule ``every`` on, due at ``due_ms``."""
    return [*every, (H_PRODUCED, str(produced_ms).encode()), (H_DELIVER_AT, str(due_ms).encode())]


def test_a_cancel_read_again_ends_the_schedule_whose_record_the_journal_left_out(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Partition 0 holds a record waiting an hour (its commit's rebuild point) and a schedule
    whose occurrence was delivered (the journal says so); then a cancel of the schedule, and the
    record the egress wrote to carry it on, produced after the cancel while that was unread (the
    adversary's long seed 4). Redis loses everything: the re-read leaves the schedule's record out
    as the journal says, so the registry has no word of the schedule when the cancel comes and the
    cancel finds nothing. It must end the schedule all the same: the record carrying it on was
    stored, and its occurrence delivered after the cancel."""
    every, now = _a_step_journaled(setup, bridges)
    target = setup.targets[0].encode()
    carried = _carried_on(every, now, now + 5000)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, None, [(H_CANCEL, b"poll")]),
            (0, b"carried", [*carried, (H_CONTINUES, b"1")]),
            (0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"8s")]),
        ],
    )
    assert wipe(setup) > 0
    again = setup.bridge("again").start()
    bridges.append(again)
    counts = counts_through(setup, b"after", 90)
    assert "the journal holds the fate of 1 records since" in again.output()
    assert b"carried" not in counts, again.output()[-3000:]


def test_a_cancel_from_another_partition_ends_a_schedule_whose_record_a_rebuild_left_out(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Partition 0 holds a schedule whose step was delivered (the journal says so), and Redis
    loses everything before the record carrying the schedule on is written: its transaction
    commits after the re-read of partition 0 found where the partition ends (what is in flight
    commits before the journal is read). The re-read leaves the schedule's record out, as the
    journal says; a cancel of the schedule read in partition 1 found no word of it anywhere,
    and the record carrying it on, read after, was stored and its occurrences delivered (the
    adversary with two replicas, seed 2, exactly once: a schedule cancelled from another
    partition went on). The registry has the schedule at the record left out, as it had before
    Redis lost it: the cancel ends it there, and the record carrying it on is nothing."""
    every, now = _a_step_journaled(setup, bridges)
    target = setup.targets[0].encode()
    assert wipe(setup) > 0
    again = setup.bridge("again").start()
    bridges.append(again)
    wait_for(lambda: again.get("/readyz")[0] == 200, 60, "ready again")
    wait_for(
        lambda: "the journal holds the fate of 1 records since" in again.output(), 30, "re-read"
    )
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [(1, None, [(H_CANCEL, b"poll")]), (1, b"read", [(H_TARGET_TOPIC, target)])],
    )
    assert counts_through(setup, b"read", 60)[b"read"] == 1
    carried = _carried_on(every, now, int(time.time() * 1000) + 3000)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, b"carried", [*carried, (H_CONTINUES, b"1")]),
            (0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"6s")]),
        ],
    )
    counts = counts_through(setup, b"after", 90)
    assert b"carried" not in counts, again.output()[-3000:]


@pytest.mark.parametrize(
    ("cancelled_in", "pinned", "ender"),
    [(1, True, "cancel"), (1, False, "cancel"), (0, False, "record")],
    ids=["across", "unpinned", "own-replaced"],
)
def test_a_cancel_that_ended_a_schedule_between_its_records_outlives_a_redis_loss(
    setup: Setup, bridges: list[Bridge], cancelled_in: int, pinned: bool, ender: str
) -> None:
    """As above, the cancel read in partition 1 (in the schedule's own: the store's test) ends
    the schedule where the registry has it: at the record whose step was delivered, the record
    carrying it on not read yet. The cancel's commit then passes it (nothing of it waits; unpinned, nothing waits
    in partition 0 either, so its rebuild starts after the schedule's record), and Redis loses
    everything again: neither the cancel nor, unpinned, the schedule's record is read again, and
    the record carrying the schedule on was stored and its occurrences delivered (the adversary
    with two replicas, seed 4, exactly once: a schedule cancelled from another partition went on
    after a Redis rollback and a wipe). The journal holds the end, as the withdrawal of the
    schedule's record by the cancel: the re-read ends the schedule there. So does a one-shot
    record with the schedule's id (it replaces the schedule), journaled as that record's
    replacement."""
    every, now = _a_step_journaled(setup, bridges, pinned)
    step = 1 if pinned else 0
    target = setup.targets[0].encode()
    assert wipe(setup) > 0
    again = setup.bridge("again").start()
    bridges.append(again)
    wait_for(lambda: again.get("/readyz")[0] == 200, 60, "ready again")
    # The egress wrote the record carrying the schedule on as the step was acknowledged: before
    # the cancel was read (it is produced below, after Redis lost everything, stamped then).
    stepped = int(time.time() * 1000)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (cancelled_in, None, [(H_CANCEL, b"poll")])
            if ender == "cancel"
            else (
                cancelled_in,
                b"one-shot",
                [(H_TARGET_TOPIC, target), (H_ID, b"poll"), (H_AFTER, b"1ms")],
            ),
            (cancelled_in, b"read", [(H_TARGET_TOPIC, target)]),
        ],
    )
    assert counts_through(setup, b"read", 60)[b"read"] == 1
    past = 2 if cancelled_in else step + 3
    wait_for(lambda: committed(setup, cancelled_in)[1] == past, 30, "committed past the cancel")
    if not pinned:
        wait_for(lambda: committed(setup, 0)[1] > step, 30, "committed past the schedule")
    assert wipe(setup) > 0
    carried = _carried_on(every, now, int(time.time() * 1000) + 1000)
    producer = Producer({"bootstrap.servers": setup.services.bootstrap})
    headers = [*carried, (H_CONTINUES, str(step).encode())]
    produce(
        producer, setup.delay, partition=0, value=b"carried", headers=headers, timestamp=stepped
    )
    assert producer.flush(30) == 0
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [(0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"3s")])],
    )
    counts = counts_through(setup, b"after", 90)
    assert b"carried" not in counts, again.output()[-3000:]


def test_a_rebuild_leaves_no_schedule_in_the_registry_whose_next_record_was_cancelled(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """As above, and the record carrying the schedule on (offset 2) was cancelled by its default
    id before Redis lost everything; the journal holds both fates. The re-read has the schedule
    at offset 1, as delivered, and then ended at offset 2: before, the schedule stayed in the
    registry as running, with no record (the adversary with two replicas, seed 4)."""
    every, now = _a_step_journaled(setup, bridges)
    target = setup.targets[0].encode()
    carried = _carried_on(every, now, now + 5000)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, b"carried", [*carried, (H_CONTINUES, b"1")]),
            (0, None, [(H_CANCEL, f"{setup.delay}:0:2".encode())]),
        ],
    )
    producer = Producer(
        {"bootstrap.servers": setup.services.bootstrap, "partitioner": "murmur2_random"}
    )
    cancelled = Entry(Fate.CANCELLED, 2, "poll", now + 5000, now, by=f"{setup.delay}:0:3")
    key, value, headers = encode_entries(setup.delay, 0, [cancelled], "")
    produce(producer, setup.journal, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0
    assert wipe(setup) > 0
    again = setup.bridge("again").start()
    bridges.append(again)
    produce_to(setup.services.bootstrap, setup.delay, [(0, b"after", [(H_TARGET_TOPIC, target)])])
    counts = counts_through(setup, b"after", 90)
    assert b"carried" not in counts
    assert "the journal holds the fate of 2 records since" in again.output()
    client = redis.Redis.from_url(setup.services.redis_url)
    try:
        schedules = Keys(f"test-{setup.unique}").of(Shard(setup.delay, 0)).schedules
        entry = _field(client, schedules, "=poll")
        assert entry is not None and entry.startswith(b"-"), entry
    finally:
        client.close()
