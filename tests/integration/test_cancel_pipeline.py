"""Cancel and replace through the whole pipeline: a bridge process, the real Kafka and Redis —
across SIGKILLs of the bridge and a FLUSHALL of its Redis, with the etf1 and kaspr dialects, and
from the command line."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import pytest
import redis
from confluent_kafka import Producer

from bridge.client import cancel_headers, delay_headers, partition_for
from bridge.kafka import produce
from bridge.message import H_AFTER, H_CANCEL, H_DELIVER_AT, H_ID, H_TARGET_TOPIC, wire_headers
from testbed.clock import python_shift  # its sitecustomize says why
from testbed.harness import (
    Bridge,
    Collector,
    Received,
    Setup,
    ToPartition,
    fast_takeover,
    metric,
    produce_all,
    produce_to,
    with_faults,
)
from tests.conftest import wait_for
from tests.integration.test_journal import counts_through

pytestmark = pytest.mark.integration

COUNT = 1000
KEYS = 20  # a cancel or replacement goes with its record's key, so to its partition
Record = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]


def schedule(
    setup: Setup, due_s: int
) -> tuple[list[Record], list[Record], dict[str, bytes], set[str]]:
    """Originals due in ``due_s``; replacements of every fifth due in 1-3 s with a new value; cancels
    of every third (after the replacements: a replaced record cancelled is cancelled). Returns
    (originals, changes, the value each surviving id must arrive with, the cancelled ids)."""
    target = setup.targets[0]
    originals: list[Record] = []
    changes: list[Record] = []
    expected: dict[str, bytes] = {}
    for i in range(COUNT):
        key, job = f"k{i % KEYS}".encode(), f"job-{i}"
        originals.append(
            (key, f"v{i}".encode(), delay_headers(target, after=f"{due_s}s", delay_id=job))
        )
        expected[job] = f"v{i}".encode()
    for i in range(0, COUNT, 5):
        key, job = f"k{i % KEYS}".encode(), f"job-{i}"
        after = f"{1000 + i % 2000}ms"
        changes.append(
            (key, f"v{i}-new".encode(), delay_headers(target, after=after, delay_id=job))
        )
        expected[job] = f"v{i}-new".encode()
    cancelled = {f"job-{i}" for i in range(0, COUNT, 3)}
    changes += [
        (f"k{i % KEYS}".encode(), b"", cancel_headers(f"job-{i}")) for i in range(0, COUNT, 3)
    ]
    return originals, changes, {k: v for k, v in expected.items() if k not in cancelled}, cancelled


def settle(
    setup: Setup, collector: Collector, expected: dict[str, bytes], due_s: int
) -> list[Received]:
    """Wait for every surviving id, then for a marker per key due after every original: a
    partition delivers in due order, so once the markers are in, a cancelled record that was
    going to arrive has arrived."""
    markers = [
        (f"k{k}".encode(), b"marker", delay_headers(setup.targets[0], after=f"{due_s + 1}s"))
        for k in range(KEYS)
    ]
    produce_all(setup.services.bootstrap, setup.delay, markers)
    collector.until(
        lambda rs: (
            set(expected) <= {r.delay_id for r in rs}
            and sum(r.value == b"marker" for r in rs) >= KEYS
        ),
        120,
        "every surviving record and every marker",
    )
    return [r for r in collector.records if r.value != b"marker"]


def check(got: list[Received], expected: dict[str, bytes], cancelled: set[str]) -> None:
    by_id: dict[str, set[bytes | None]] = defaultdict(set)
    for r in got:
        by_id[r.delay_id].add(r.value)
        assert r.timestamp_ms >= r.due_ms, f"{r.delay_id} delivered early"
    arrived = sorted(set(by_id) & cancelled)
    assert not arrived, f"{len(arrived)} cancelled records arrived, e.g. " + ", ".join(
        f"{r.delay_id}={r.value!r} due {r.due_ms} at {r.timestamp_ms}"
        for r in got
        if r.delay_id in arrived[:5]
    )
    assert set(by_id) == set(expected)
    # Each arrives with its latest value only (a duplicate after a kill is the same record).
    assert {k: v for k, v in by_id.items() if v != {expected[k]}} == {}


def test_cancel_and_replace_hold_across_two_sigkills(setup: Setup, bridges: list[Bridge]) -> None:
    originals, changes, expected, cancelled = schedule(setup, 12)
    collector = setup.collector()
    bridge = fast_takeover(setup, "bridge-1")
    bridges.append(bridge)
    try:
        produce_all(setup.services.bootstrap, setup.delay, originals)
        wait_for(
            lambda: metric(bridge, "delay_bridge_ingested_total") >= COUNT // 2,
            30,
            "half the originals stored",
        )
        bridge.signal(signal.SIGKILL)
        bridge = fast_takeover(setup, "bridge-2")
        bridges.append(bridge)
        produce_all(setup.services.bootstrap, setup.delay, changes)
        wait_for(
            lambda: metric(bridge, "delay_bridge_replaced_total") > 0,
            30,
            "the first replacements applied",
        )
        bridge.signal(signal.SIGKILL)
        bridge = fast_takeover(setup, "bridge-3")
        bridges.append(bridge)
        got = settle(setup, collector, expected, 12)
    finally:
        collector.close()
    check(got, expected, cancelled)


@pytest.mark.parametrize("ahead", [False, True], ids=["true-stamps", "one-stamped-ahead"])
def test_a_cancel_behind_a_backlog_wins_over_a_record_due_meanwhile(
    setup: Setup, bridges: list[Bridge], ahead: bool
) -> None:
    """A record in Redis falls due while its replica is down; its cancel was produced before
    that, behind thousands of other records. The next replica reads them all before it claims
    the record: nothing produced before a record fell due is left unread when it is claimed.
    ``ahead``: first in the backlog, a record whose producer's clock is an hour ahead (Kafka
    takes a CreateTime up to message.timestamp.after.max.ms ahead of the broker's, one hour by
    default): its stamp says nothing of what was produced before it."""
    target = setup.targets[0]
    bridge = fast_takeover(setup, "bridge-1")
    bridges.append(bridge)
    key = b"order-1"
    # Due 6 s after it is produced: the backlog and the cancel behind it must all be produced
    # before then (a cancel produced after the due time may lose: the contract), and on a busy
    # machine storing the record, the kill and the 5,001 records took more than 3 s.
    due = time.time() + 6
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [(key, b"expire", delay_headers(target, after="6s", delay_id="expire-1"))],
    )
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    bridge.signal(signal.SIGKILL)
    if ahead:
        skewed = Producer({"bootstrap.servers": setup.services.bootstrap})
        headers = delay_headers(target, after="1d")
        stamp = int(time.time() * 1000) + 3_600_000 - 60_000  # within the broker's hour
        produce(skewed, setup.delay, key=key, value=b"ahead", headers=headers, timestamp=stamp)
        assert skewed.flush(30) == 0
    backlog: list[Record] = [(key, b"later", delay_headers(target, after="1h"))] * 5000
    produce_all(
        setup.services.bootstrap, setup.delay, [*backlog, (key, b"", cancel_headers("expire-1"))]
    )
    assert time.time() < due - 0.2, "the cancel was produced after its record's due time"
    marker = [(key, b"marker", delay_headers(target, after="0ms"))]
    wait_for(lambda: time.time() > due + 1, 10, "the record to fall due, its replica down")
    bridge = fast_takeover(setup, "bridge-2")
    bridges.append(bridge)
    produce_all(setup.services.bootstrap, setup.delay, marker)  # after the cancel, same partition
    records = setup.await_value(b"marker", 60, "the marker")
    assert [r.value for r in records] == [b"marker"]
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1


def test_cancel_and_replace_hold_after_redis_loses_everything(
    setup: Setup, bridges: list[Bridge], scratch_redis: str
) -> None:
    """Half the keys' cancels go one a record, the other half's in one record per key (several
    delay-cancel headers, as the command line's bulk cancel sends them, and an id never
    scheduled): each cancelled, and again when the bridge rebuilds Redis from the delay topic."""
    originals, changes, expected, cancelled = schedule(setup, 12)
    packed: dict[bytes, list[str]] = defaultdict(list)
    for key, _, headers in changes:
        named = [(v or b"").decode() for k, v in headers if k == "delay-cancel"]
        if named and key is not None and int(key[1:]) % 2:
            packed[key] += named
    changes = [c for c in changes if c[0] not in packed or c[1] != b""] + [
        (key, b"", cancel_headers(*ids, "never-scheduled")) for key, ids in packed.items()
    ]
    collector = setup.collector()
    bridge = setup.bridge(redis__url=scratch_redis).start()
    bridges.append(bridge)
    client = redis.Redis.from_url(scratch_redis)
    try:
        produce_all(setup.services.bootstrap, setup.delay, originals + changes)
        replacements = sum(1 for c in changes if c[1] != b"")
        wait_for(
            lambda: (
                metric(bridge, "delay_bridge_replaced_total") >= replacements
                and metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}')
                == len(cancelled)
                and metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}')
                == len(packed)
            ),
            30,
            "the changes applied",
        )
        client.flushall()  # rebuilt from the committed offsets: the same changes apply again
        wait_for(lambda: "redis lost" in bridge.output(), 30, "the bridge to notice")
        got = settle(setup, collector, expected, 12)
    finally:
        collector.close()
        client.close()
    check(got, expected, cancelled)


def test_partition_for_is_where_a_murmur2_producer_puts_a_key(setup: Setup) -> None:
    """bridge.client.partition_for against librdkafka's murmur2_random on the real broker (the
    partitioner Java clients and the bridge's CLI use)."""
    producer = Producer(
        {"bootstrap.servers": setup.services.bootstrap, "partitioner": "murmur2_random"}
    )
    keys = [f"order-{n}".encode() for n in range(60)] + [b"", "é-ü".encode(), bytes(range(7))]
    landed: dict[bytes | None, int | None] = {}
    for key in keys:
        producer.produce(
            setup.delay,
            key=key,
            value=b"v",
            on_delivery=lambda err, msg: landed.update({msg.key(): msg.partition()}),
        )
    assert producer.flush(30) == 0
    assert landed == {key: partition_for(key, 3) for key in keys}
    assert len(set(landed.values())) == 3


def test_a_cancel_read_after_its_record_fell_due_wins_over_a_live_ingress_behind(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """The ingress reads the partition live but falls behind (one record per batch: one Redis
    call each), and the cancel of a record with its own delay-id, due in 1 s, is 3,000 records
    behind it: read seconds later, after the record fell due. The cancel was
    in the log before the due time, so it wins: the record waits for the ingress to read up to
    its due time."""
    target = setup.targets[0]
    bridge = _reading_at_its_end(setup, bridges, "1")
    key = b"order-1"
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [
            (key, b"expire", delay_headers(target, after="1s", delay_id="expire-1")),
            *[(key, b"later", delay_headers(target, after="1h"))] * 3000,
            (key, b"", cancel_headers("expire-1")),
            (key, b"marker", delay_headers(target, after="0ms")),
        ],
    )
    [marker] = setup.await_value(b"marker", 60, "the marker")
    assert marker.value == b"marker"
    # The marker, produced after the record and due at once, was read after the cancel.
    assert marker.timestamp_ms > marker.due_ms + 1000, "the cancel was read in time: test void"
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1


@pytest.mark.parametrize("ahead_ms", [0, 10_000], ids=["true-clock", "bridge-clock-ahead"])
def test_a_cancel_waiting_while_the_ingress_stores_another_partition_wins(
    setup: Setup, bridges: list[Bridge], ahead_ms: int
) -> None:
    """The same, one partition over: the ingress is storing a batch of 10,000 records of
    partition 0 when the cancel of a record of partition 1 comes, some 200 ms before that
    record's due time, and waits in the consumer's queue, fetched and not yet taken. The
    ingress last said partition 1 was read at its end before it took the batch: that is no
    word on what came since. The record waits for the ingress to say so again — also on a
    bridge whose own clock is ahead (claims go by Redis's): how old a saying is is not read
    off that clock."""
    bridge = _reading_at_its_end(setup, bridges, "20000", ahead_ms)
    producer = _holding(setup)

    def attempt(n: int) -> bool:
        due_ms, before, got, in_time = _behind_another_partition(setup, bridge, producer, n)
        return _withdrawn(bridge, got, n, due_ms, in_time, before)

    _in_time(attempt)


@pytest.mark.parametrize("replacement", [False, True], ids=["cancel", "replacement"])
def test_a_cancel_applied_while_its_record_is_claimed_and_on_its_way_back_wins(
    setup: Setup, bridges: list[Bridge], replacement: bool
) -> None:
    """The scene before, one step on: the mover claims the record as it falls due and finds the
    ingress has not said its partition is read since, so it puts the record back — but is
    descheduled between its claim and its put-back (a fault hook holds the put-back until the
    ingress has applied the record after it), and the ingress applies the cancel meanwhile: the
    record is in flight then, waiting again a moment later. The cancel still wins; so does a
    replacement (the record it replaced is not delivered)."""
    hold = setup.tmp / "hold"
    hold.mkdir()
    faults = {"HOLD_UNCLAIM_VALUE": "held", "HOLD_DIR": str(hold)}
    bridge = _reading_at_its_end(setup, bridges, "20000", faults=faults)
    producer = _holding(setup)

    def attempt(n: int) -> bool:
        (hold / "held").unlink(missing_ok=True)
        replaced = metric(bridge, "delay_bridge_replaced_total")
        scene = _behind_another_partition(setup, bridge, producer, n, b"held", replacement)
        _, before, got, in_time = scene
        if replacement:
            stored = "delay_bridge_ingested_total"
            wait_for(lambda: metric(bridge, stored) >= 10_003 * (n + 1), 30, "the record stored")
        else:
            wait_for(lambda: sum(_cancels(bridge)) == sum(before) + 1, 30, "the cancel applied")
        if not in_time or not (hold / "held").exists():  # void: late, or nothing put back
            return False
        if replacement:
            now = metric(bridge, "delay_bridge_replaced_total")
            assert now == replaced + 1, "the replacement replaced nothing: put back after it"
        else:
            found = _cancels(bridge)[0] == before[0] + 1
            assert found, "the cancel found nothing: put back after it"
        delivered = setup.collector()
        try:
            delivered.poll(2.0)  # the record, put back, would be claimed again by now
        finally:
            delivered.close()
        assert b"held" not in [r.value for r in [*got, *delivered.records]], "delivered"
        return True

    _in_time(attempt)


def _behind_another_partition(
    setup: Setup,
    bridge: Bridge,
    producer: Producer,
    n: int,
    value: bytes | None = None,
    replacement: bool = False,
) -> tuple[int, tuple[float, float], list[Received], bool]:
    """Attempt ``n``'s scene: its record (:func:`_expiring`, in partition 1) due in 3 s; 250 ms
    before then a batch of 10,000 records of partition 0 flushed, and 30 ms later (fetched, the
    cancel not with it) the record's cancel (or ``replacement``: a record with its delay-id due
    in an hour); then a marker produced with the batch, delivered. Returns the record's due
    time, the bridge's cancels before it, what was delivered by the marker, and whether the
    cancel was produced 100 ms before the due time (else: void)."""
    due_ms, before = _expiring(setup, bridge, n, partition=1, value=value)
    _queue_burst(producer, setup, n, b"k", partition=0)
    marker = f"marker-{n}".encode()
    headers = wire_headers([*delay_headers(setup.targets[0], after="0ms")])
    producer.produce(setup.delay, marker, b"k", partition=0, headers=headers)
    wait_for(lambda: time.time() * 1000 >= due_ms - 250, 10, "250 ms before the due time")
    assert producer.flush(30) == 0
    fetched = time.time() + 0.03
    wait_for(lambda: time.time() >= fetched, 5, "the batch fetched, the cancel not with it")
    if replacement:
        named = delay_headers(setup.targets[0], after="1h", delay_id=f"e{n}")
        producer.produce(setup.delay, b"later", b"k", partition=1, headers=wire_headers([*named]))
    else:
        cancel = wire_headers([*cancel_headers(f"e{n}")])
        producer.produce(setup.delay, b"", b"k", partition=1, headers=cancel)
    assert producer.flush(30) == 0
    in_time = time.time() * 1000 < due_ms - 100  # else void: the cancel may lose
    return due_ms, before, setup.await_value(marker, 60, "the marker"), in_time


def _expiring(
    setup: Setup,
    bridge: Bridge,
    n: int,
    *,
    partition: int | None = None,
    key: bytes = b"k",
    value: bytes | None = None,
) -> tuple[int, tuple[float, float]]:
    """Attempt ``n``'s record (delay-id ``e<n>``, its value ``value`` else ``expire-<n>``), due in
    3 s, to ``partition`` (else where ``key`` goes), once the bridge has stored it: its due time,
    and the bridge's cancels before it (:func:`_cancels`)."""
    due_ms = int(time.time() * 1000) + 3000
    before = _cancels(bridge)
    stored = metric(bridge, "delay_bridge_ingested_total")
    record = (
        key,
        value or f"expire-{n}".encode(),
        delay_headers(setup.targets[0], at=due_ms, delay_id=f"e{n}"),
    )
    if partition is None:
        produce_all(setup.services.bootstrap, setup.delay, [record])
    else:
        produce_to(setup.services.bootstrap, setup.delay, [(partition, record[1], [*record[2]])])
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") > stored, 30, "stored")
    return due_ms, before


def _queue_burst(
    producer: Producer, setup: Setup, n: int, key: bytes, partition: int | None = None
) -> None:
    """10,000 records with ids of their own due in an hour, queued in ``producer`` (see
    :func:`_holding`) to ``partition`` (else where ``key`` goes) until its next flush."""
    for i in range(10_000):
        headers = wire_headers([*delay_headers(setup.targets[0], after="1h", delay_id=f"{n}-f{i}")])
        if partition is None:
            producer.produce(setup.delay, b"", key, headers=headers)
        else:
            producer.produce(setup.delay, b"", key, partition=partition, headers=headers)


def _holding(setup: Setup) -> Producer:
    """A producer that holds what it is given until it is flushed (its linger, and batches as
    large as a request), and then sends it in one request: fetched together, read in one batch
    (a Kafka batch holds 10,000 records by default). Its metadata is known before the clock runs."""
    producer = Producer(
        {
            "bootstrap.servers": setup.services.bootstrap,
            "linger.ms": 60_000,
            "batch.num.messages": 100_000,
            "batch.size": 4 << 20,
        }
    )
    producer.list_topics(setup.delay, 10)
    return producer


def _withdrawn(
    bridge: Bridge,
    got: list[Received],
    n: int,
    due_ms: int,
    in_time: bool,
    before: tuple[float, float],
) -> bool:
    """Whether attempt ``n`` set its scene in time and, if it did, that its record (due at
    ``due_ms``) was withdrawn by its cancel: ``got`` is what was delivered by when its marker,
    stored with or after the cancel, was; ``before`` the bridge's cancels before the attempt."""
    wait_for(lambda: sum(_cancels(bridge)) == sum(before) + 1, 30, "the cancel applied")
    [marker] = [r for r in got if r.value == f"marker-{n}".encode()]
    if not in_time or marker.timestamp_ms <= due_ms:  # void: the batch stored before due
        return False
    assert f"expire-{n}".encode() not in [r.value for r in got]  # not delivered
    assert _cancels(bridge)[0] == before[0] + 1  # withdrawn
    return True


def _cancels(bridge: Bridge) -> tuple[float, float]:
    """The bridge's cancels that withdrew a record, and those that found none."""
    return (
        metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}'),
        metric(bridge, 'delay_bridge_cancelled_total{result="not-found"}'),
    )


def _in_time(attempt: Callable[[int], bool], attempts: int = 3) -> None:
    """Run ``attempt`` (given its number, from 0) until one sets its scene in time, which it
    says by returning True once it has checked its outcome; False when the machine was too
    slow for it (a cancel flushed less than 100 ms before its due time, or a batch stored
    before it): an outcome the guarantee does not cover."""
    for n in range(attempts):
        if attempt(n):
            return
    pytest.fail(f"none of {attempts} attempts set its scene in time: the machine is too slow")


def _reading_at_its_end(
    setup: Setup,
    bridges: list[Bridge],
    batch_size: str,
    ahead_ms: int = 0,
    faults: dict[str, str] | None = None,
    yaml: str = "",
    **settings: str,
) -> Bridge:
    """A bridge started with ``ingress.batch_size`` and ``settings`` (its own clock ``ahead_ms``
    ahead; the test fault hooks ``faults`` set; ``yaml``: a configuration file's text, for what
    the environment cannot set), its partitions assigned and read at their end: ready, or naming
    the skew of its clock."""
    bridge = setup.bridge(ingress__batch_size=batch_size, **settings)
    if yaml:
        config = setup.tmp / "bridge.yaml"
        config.write_text(yaml)
        bridge.env["DELAY_BRIDGE_CONFIG"] = str(config)
    if ahead_ms:
        bridge.env.update(python_shift(ahead_ms))
    if faults:
        bridge.env = with_faults(bridge.env, **faults)
    bridges.append(bridge.start())

    def ready() -> bool:
        status, body = bridge.get("/readyz")
        return status == 200 or (ahead_ms > 0 and "clock skew" in body)

    wait_for(
        lambda: "assigned" in bridge.output() and ready(),
        60,
        "the partitions assigned, read at their end",
    )
    return bridge


def _counted(bridge: Bridge, name: str) -> bool:
    return metric(bridge, name) > 0


def test_a_sigkill_while_a_bulk_cancel_and_a_bulk_fire_apply_loses_and_doubles_nothing(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """1,500 records of a customer cancelled in bulk, 1,500 of another fired, 1,500 left alone, due
    in an hour; the bridge (a static member) SIGKILLed once it applied a first batch of each
    command's records,
    and started again at once. Every cancelled record is gone and never delivered; every fired
    one is delivered and none waits any longer (its original would be a second delivery in an
    hour); the others wait."""
    target, count = setup.targets[0], 1500
    records = [
        (f"{who}-{i}".encode(), b"v", delay_headers(target, after="1h"))
        for who in ("c", "f", "k")
        for i in range(count)
    ]
    instance = {"kafka__group_instance_id": f"pod-{setup.unique}"}
    bridge = fast_takeover(setup, "bridge-1", **instance)
    bridges.append(bridge)
    produce_all(setup.services.bootstrap, setup.delay, records)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") >= 3 * count, 30, "all stored")
    for n, (verb, prefix, applied) in enumerate(
        (
            ("cancel", "c-", 'delay_bridge_cancelled_total{result="cancelled"}'),
            ("fire", "f-", "delay_bridge_replaced_total"),
        )
    ):
        command = subprocess.Popen(
            [sys.executable, "-m", "bridge", verb, "--key-prefix", prefix, "--yes"],
            env=bridge.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(functools.partial(_counted, bridge, applied), 60, f"the {verb} applying")
        bridge.signal(signal.SIGKILL)
        bridge = fast_takeover(setup, f"bridge-{n + 2}", **instance)
        bridges.append(bridge)
        out, err = command.communicate(timeout=60)
        assert command.returncode == 0 and out.startswith(f"{verb}"), (out, err)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len({r.key for r in rs}) >= count, 60, "the fired delivered")
    finally:
        collector.close()
    assert {r.key for r in collector.records} == {f"f-{i}".encode() for i in range(count)}

    def waiting() -> set[bytes]:
        keys: set[bytes] = set()
        for skip in range(0, 3 * count, 1000):  # a page is at most 1,000 records
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bridge",
                    "list",
                    "--json",
                    "--limit",
                    "1000",
                    "--skip",
                    str(skip),
                ],
                env=bridge.env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            page = json.loads(proc.stdout)
            keys |= {r["key"].encode() for r in page}
            if len(page) < 1000:
                break
        return keys

    wait_for(
        lambda: waiting() == {f"k-{i}".encode() for i in range(count)},
        30,
        "only the records left alone waiting",
    )


def test_a_cancel_in_the_batch_the_ingress_is_storing_wins_over_its_record_falling_due(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """The ingress reads the partition at its end. A cancel is produced some 200 ms before its
    record's due time, behind 10,000 other records with ids of their own that come in one fetch
    and one batch (``ingress.batch_size`` 20,000), which takes the ingress longer to store than
    the time left.
    The record falls due while its cancel is in the ingress's hands, read but not yet applied:
    the cancel was produced more than 100 ms before the due time, so it wins."""
    target = setup.targets[0]
    bridge = _reading_at_its_end(setup, bridges, "20000")
    key = b"order-1"
    producer = _holding(setup)

    def attempt(n: int) -> bool:
        due_ms, before = _expiring(setup, bridge, n, key=key)
        _queue_burst(producer, setup, n, key)
        wait_for(lambda: time.time() * 1000 >= due_ms - 200, 10, "200 ms before the due time")
        marker = f"marker-{n}".encode()
        producer.produce(setup.delay, b"", key, headers=wire_headers([*cancel_headers(f"e{n}")]))
        producer.produce(
            setup.delay, marker, key, headers=wire_headers([*delay_headers(target, after="0ms")])
        )
        assert producer.flush(30) == 0
        in_time = time.time() * 1000 < due_ms - 100  # else void: the cancel may lose
        got = setup.await_value(marker, 60, "the marker")
        return _withdrawn(bridge, got, n, due_ms, in_time, before)

    _in_time(attempt)


@pytest.mark.parametrize(
    ("around", "late_ms"),
    [
        pytest.param(False, 0, id="alone"),
        pytest.param(True, 0, id="records-around"),
        pytest.param(True, 400, id="mover-late"),
    ],
)
def test_a_cancel_by_default_id_produced_before_the_margin_wins(
    setup: Setup, bridges: list[Bridge], around: bool, late_ms: int
) -> None:
    """The default id ``<topic>:<partition>:<offset>`` is an id like any other: a cancel of it
    produced to the record's partition 250 ms before the due time wins (void if flushed later
    than 100 ms before it). Alone, the mover claims the record a quarter of ``egress.ahead``
    (100 ms) before it falls due: the cancel is read before the claim. With records due every 2
    ms around it, the mover claims it up to three quarters of it (300 ms) ahead: the cancel,
    read after the claim, takes it back from those held until due (CatchUp.take_back) — even
    when the mover answers the take-back ``late_ms`` late, past the due time: the ingress took
    the record out of the sender's hands when it asked."""
    target = setup.targets[0]
    faults = {"LATE_TAKE_BACK_MS": str(late_ms)} if late_ms else None
    bridge = _reading_at_its_end(setup, bridges, "500", faults=faults)
    producer = _holding(setup)

    def attempt(n: int) -> bool:
        due_ms = int(time.time() * 1000) + 3000
        before = _cancels(bridge)
        value = f"expire-{n}".encode()
        others = range(-1000, 1000, 2) if around else ()
        coords = produce_all(
            setup.services.bootstrap,
            setup.delay,
            [
                (b"k", value, delay_headers(target, at=due_ms)),
                *[(b"k", b"", delay_headers(target, at=due_ms + t)) for t in others if t],
            ],
        )
        partition, offset = coords[0]
        wait_for(lambda: time.time() * 1000 >= due_ms - 250, 10, "250 ms before the due time")
        marker = f"marker-{n}".encode()
        cancel = wire_headers([*cancel_headers(f"{setup.delay}:{partition}:{offset}")])
        producer.produce(setup.delay, b"", b"k", partition=partition, headers=cancel)
        producer.produce(
            setup.delay,
            marker,
            b"k",
            partition=partition,
            headers=wire_headers([*delay_headers(target, at=due_ms + 1500)]),
        )
        assert producer.flush(30) == 0
        in_time = time.time() * 1000 < due_ms - 100  # else void: the cancel may lose
        got = setup.await_value(marker, 60, "the marker")
        return _withdrawn(bridge, got, n, due_ms, in_time, before)

    _in_time(attempt)


def test_a_cancel_by_default_id_meeting_its_record_on_its_way_to_its_targets_rate_wins(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A record of a rate-limited target (``egress.max_rate_per_target``: one a second), named
    by its default id, claimed ahead (``egress.ahead`` 1 s: 250 ms before due) just after
    another record of that target took the second's token: the mover puts it into the target's
    wait index — and is descheduled between the claim and the put-back (a fault hook holds the
    put-back until the ingress has applied the record after it), while the ingress applies the
    record's cancel, produced 200 ms before the due time: the record is in flight then, in the
    wait index a moment later, held by no sender. The cancel still wins."""
    slow, other = setup.targets
    hold = setup.tmp / "hold"
    hold.mkdir()
    faults = {"HOLD_UNCLAIM_VALUE": "held", "HOLD_UNCLAIM_WAIT": "1", "HOLD_DIR": str(hold)}
    yaml = f"egress:\n  max_rate_per_target: {{{slow}: 1}}\n"
    bridge = _reading_at_its_end(
        setup, bridges, "500", faults=faults, yaml=yaml, egress__ahead="1s"
    )
    producer = _holding(setup)

    def attempt(n: int) -> bool:
        (hold / "held").unlink(missing_ok=True)
        due_ms = int(time.time() * 1000) + 3000
        before = _cancels(bridge)
        coords = produce_all(
            setup.services.bootstrap,
            setup.delay,
            [
                (b"k", b"first", delay_headers(slow, at=due_ms - 700)),  # the second's token
                (b"k", b"held", delay_headers(slow, at=due_ms)),
            ],
        )
        partition, offset = coords[1]
        wait_for(lambda: time.time() * 1000 >= due_ms - 200, 10, "200 ms before the due time")
        marker = f"marker-{n}".encode()
        cancel = wire_headers([*cancel_headers(f"{setup.delay}:{partition}:{offset}")])
        producer.produce(setup.delay, b"", b"k", partition=partition, headers=cancel)
        at = wire_headers([*delay_headers(other, at=due_ms + 1500)])
        producer.produce(setup.delay, marker, b"k", partition=partition, headers=at)
        assert producer.flush(30) == 0
        in_time = time.time() * 1000 < due_ms - 100  # else void: the cancel may lose
        got = setup.await_value(marker, 60, "the marker")
        if not in_time or not (hold / "held").exists():  # void: late, or not put back in flight
            return False
        delivered = setup.collector()
        try:
            delivered.poll(2.0)  # from the wait index at a record a second, by now
        finally:
            delivered.close()
        assert b"held" not in [r.value for r in [*got, *delivered.records]], "delivered"
        return _withdrawn(bridge, got, n, due_ms, in_time, before)

    _in_time(attempt)


@pytest.mark.parametrize("open_past_due_ms", [1_500, 6_000], ids=["briefly", "for-seconds"])
def test_a_cancel_behind_another_producers_open_transaction_wins_over_its_record(
    setup: Setup, bridges: list[Bridge], open_past_due_ms: int
) -> None:
    """A record with its own delay-id, produced in a transaction; another producer then opens a
    transaction in its partition and keeps it open past the due time. The cancel, produced a
    second before the due time, lands behind that transaction's first record: in the log in
    time, unreadable until the commit. The partition's read position stands still below its end
    for seconds — before the cancel (the catch-up asks, and finds the transaction open) and after
    it (the transaction held open for seconds past the due time). The record waits for it:
    what is held back behind the open transaction may be its cancel."""
    target = setup.targets[0].encode()
    bridge = _reading_at_its_end(setup, bridges, "1000")
    due_ms = int(time.time() * 1000) + 6_000
    held, produced_ms = _cancel_behind_an_open_transaction(setup, bridge, due_ms)
    held_open = 'delay_bridge_held_partitions{reason="open-transaction"}'
    wait_for(lambda: metric(bridge, held_open) == 1, 10, "the partition held, and said so")
    wait_for(lambda: time.time() * 1000 > due_ms + open_past_due_ms, 20, "past the due time")
    held.commit_transaction(30)
    assert produced_ms < due_ms - 200, "the cancel produced late: test void"
    after: ToPartition = [(0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"0s")])]
    produce_to(setup.services.bootstrap, setup.delay, after)
    counts = counts_through(setup, b"after", 60)
    assert b"cancelled" not in counts, bridge.output()[-3000:]
    assert metric(bridge, 'delay_bridge_cancelled_total{result="cancelled"}') == 1
    assert "a transaction open from offset" in bridge.output()  # the log says why it waited
    wait_for(lambda: metric(bridge, held_open) == 0, 10, "the partition no longer held")


def _cancel_behind_an_open_transaction(
    setup: Setup, bridge: Bridge, due_ms: int
) -> tuple[Producer, int]:
    """In partition 0: a record with its own delay-id ("o", value b"cancelled") due at
    ``due_ms``, produced in a transaction and stored by ``bridge``; another producer's
    transaction opened behind it; the record's cancel a second before ``due_ms``, behind that.
    Returns the open transaction's producer and when the cancel was acknowledged (epoch ms)."""
    target = setup.targets[0].encode()
    headers = [(H_TARGET_TOPIC, target), (H_DELIVER_AT, b"%d" % due_ms), (H_ID, b"o")]
    first = _transaction(setup, "first")
    first.begin_transaction()
    produce(first, setup.delay, partition=0, key=b"k", value=b"cancelled", headers=headers)
    first.commit_transaction(30)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 1, 30, "the record stored")
    held = _transaction(setup, "held")
    held.begin_transaction()
    filler = [(H_TARGET_TOPIC, target), (H_AFTER, b"1h")]
    produce(held, setup.delay, partition=0, key=b"k", value=b"filler", headers=filler)
    assert held.flush(30) == 0  # appended, uncommitted: the partition's end moved
    plain = Producer({"bootstrap.servers": setup.services.bootstrap, "linger.ms": 0})
    plain.list_topics(setup.delay, timeout=10)  # its metadata at hand: the cancel goes at once
    # Seconds pass: the position and the end stand still longer than STALLED_S (2 s).
    wait_for(lambda: time.time() * 1000 > due_ms - 1_000, 15, "a second before the due time")
    produce(plain, setup.delay, partition=0, key=None, value=None, headers=[(H_CANCEL, b"o")])
    assert plain.flush(30) == 0
    return held, int(time.time() * 1000)


def _transaction(setup: Setup, name: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": setup.services.bootstrap,
            "transactional.id": f"{setup.unique}-{name}",
        }
    )
    producer.init_transactions(30)
    return producer


def test_a_cancel_wins_over_its_record_left_leased_by_a_replica_killed_putting_it_back(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """The scene before, and a crash in it: the mover claims the record at its due time, finds
    its partition read behind the open transaction, and is SIGKILLed before its put-back (a
    fault hook holds it there): the record is left leased in Redis, never produced. The next
    replica takes the partition over once the transaction ends, and reads the cancel before or
    after it takes the lease over: the record must not be delivered — a lease an earlier owner
    left is not a record past cancel (the adversary, seed 12: delivered as a redelivery)."""
    hold = setup.tmp / "hold"
    hold.mkdir()
    faults = {"HOLD_UNCLAIM_VALUE": "cancelled", "HOLD_DIR": str(hold)}
    session = "kafka:\n  consumer: {session.timeout.ms: '6000', heartbeat.interval.ms: '1000'}\n"
    target = setup.targets[0].encode()
    bridge = _reading_at_its_end(setup, bridges, "1000", faults=faults, yaml=session)
    due_ms = int(time.time() * 1000) + 5_000
    held, produced_ms = _cancel_behind_an_open_transaction(setup, bridge, due_ms)
    assert produced_ms < due_ms - 200, "the cancel produced late: test void"
    wait_for((hold / "held").exists, 15, "the record claimed, on its way back")
    bridge.kill()  # the record leased in Redis, not produced
    held.commit_transaction(30)
    second = setup.bridge("second", ingress__batch_size="1000")
    bridges.append(second.start())
    after: ToPartition = [(0, b"after", [(H_TARGET_TOPIC, target), (H_AFTER, b"0s")])]
    produce_to(setup.services.bootstrap, setup.delay, after)
    counts = counts_through(setup, b"after", 60)
    assert b"cancelled" not in counts, second.output()[-3000:]
