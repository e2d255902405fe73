"""Recurring schedules on the real servers: each occurrence delivered once, at its instant, and the
schedule carried on through the delay topic until its count, its end, a cancel or a replacement
(bridge.egress.recurring, add.lua's schedule registry)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from bridge.client import partition_for
from bridge.message import (
    H_CANCEL,
    H_COUNT,
    H_CRON,
    H_DELIVER_AT,
    H_EVERY,
    H_ID,
    H_MAX_LATENESS,
    H_MISSED,
    H_OCCURRENCE,
    H_PAUSE,
    H_RESUME,
    H_TARGET_TOPIC,
    H_TIMEZONE,
    Headers,
)
from bridge.store import Shard, Store
from testbed.harness import (
    Bridge,
    Collector,
    Received,
    Setup,
    ToPartition,
    assert_no_garbage_since,
    cycle_collector,
    metric,
    produce_to,
    wait_ready,
    wipe,
    with_faults,
)
from testbed.services import ROOT
from tests.conftest import wait_for
from tests.unit.test_recurring import CASES, ms

pytestmark = pytest.mark.integration

EXACTLY_ONCE = {"egress__exactly_once": "true", "egress__transaction": "100ms"}
TIERS = {"store__payload_horizon": "4s", "store__fetch_ahead": "2s"}


def _schedule(
    setup: Setup, sid: bytes, start_ms: int, every: bytes, *more: tuple[str, bytes]
) -> Headers:
    return [
        (H_TARGET_TOPIC, setup.targets[0].encode()),
        (H_EVERY, every),
        (H_ID, sid),
        (H_DELIVER_AT, str(start_ms).encode()),
        *more,
    ]


def _occurrences(records: list[Received], topic: str, sid: str = "") -> list[int]:
    """The ``delay-occurrence`` of each record of ``topic`` (of schedule ``sid``), as delivered."""
    return [
        int(r.header(H_OCCURRENCE) or b"-1")
        for r in records
        if r.topic == topic and (not sid or r.delay_id == sid)
    ]


def _start(setup: Setup, bridges: list[Bridge], **overrides: str) -> Bridge:
    bridge = setup.bridge(**overrides).start()
    bridges.append(bridge)
    return bridge


def _consuming(setup: Setup, bridges: list[Bridge], **overrides: str) -> Bridge:
    """A bridge started and consuming the delay topic (ready, with its partitions assigned)."""
    bridge = _start(setup, bridges, **overrides)
    assert wait_ready(bridge), bridge.output()
    wait_for(lambda: metric(bridge, "delay_bridge_owned_partitions") >= 1, 60, "its partitions")
    return bridge


def _next_second(ms_ahead: int = 2000) -> int:
    now = time.time_ns() // 1_000_000
    return (now + ms_ahead) // 1000 * 1000


@pytest.mark.parametrize("overrides", [{}, EXACTLY_ONCE], ids=["at-least-once", "exactly-once"])
def test_an_interval_schedule_delivers_each_occurrence_once_at_its_instant_up_to_its_count(
    setup: Setup, bridges: list[Bridge], overrides: dict[str, str]
) -> None:
    """Every second from a given instant, four times: four occurrences, each once, none before its
    instant, each with the schedule's delay-id, key and value and its own delay-occurrence; then
    nothing more, and nothing of it left in Redis."""
    # The bridge consumes before the schedule is produced: one that started after its four
    # seconds had passed would deliver the latest alone (delay-missed: latest), and this test is
    # about each occurrence at its instant.
    bridge = _consuming(setup, bridges, **overrides)
    start = _next_second(3000)
    headers = _schedule(setup, b"poll-partner", start, b"1s", (H_COUNT, b"4"))
    produce_to(setup.services.bootstrap, setup.delay, [(1, b"poll", headers)])
    wait_for(lambda: metric(bridge, 'delay_bridge_schedules{state="running"}') == 1, 30, "it runs")
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 4, 60, "4 occurrences")
        end = time.monotonic() + 2.5  # a fifth occurrence would be due by then
        while time.monotonic() < end:
            collector.poll()
    finally:
        collector.close()
    target = collector.of(setup.targets[0])
    assert _occurrences(target, setup.targets[0]) == [start + k * 1000 for k in range(4)]
    # The last occurrence ended it: the registry forgets it and the gauge says none run.
    wait_for(lambda: metric(bridge, 'delay_bridge_schedules{state="running"}') == 0, 10, "none")
    for r in target:
        assert r.value == b"poll" and r.key == b"k" and r.delay_id == "poll-partner"
        assert r.due_ms == int(r.header(H_OCCURRENCE) or b"0")
        assert r.timestamp_ms >= r.due_ms and r.seen_ms >= r.due_ms  # never early
        assert r.header(H_EVERY) is None and r.header(H_COUNT) is None  # control headers stripped
    assert collector.of(setup.dlq) == []


@pytest.mark.parametrize(
    "overrides", [{}, {"egress__exactly_once": "true"}], ids=["at-least-once", "exactly-once"]
)
def test_occurrences_leave_no_garbage_for_the_collector(
    setup: Setup, bridges: list[Bridge], overrides: dict[str, str]
) -> None:
    """An occurrence and the record carrying its schedule on hold no reference cycle, as a
    one-shot record does not (test_pipeline's and test_exactly_once's tests of it): 2,000
    schedules every second, four times each, and the cycle collector finds next to nothing. A
    cycle a record made each one garbage for the collector, whose collections held the
    interpreter 100-200 ms at a time (docs/bench/history.md)."""
    bridge = _consuming(setup, bridges, **overrides)
    before = cycle_collector(bridge)
    start = _next_second(4000)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (i % 3, b"v", _schedule(setup, f"gc-{i}".encode(), start, b"1s", (H_COUNT, b"4")))
            for i in range(2_000)
        ],
    )
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 8_000, 90, "8,000 occurrences")
    finally:
        collector.close()
    assert_no_garbage_since(bridge, before, "8,000 occurrences")


def test_a_cancel_ends_a_schedule_and_a_record_with_its_id_replaces_it(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Two schedules every second: once each has delivered twice, one is cancelled and the other
    replaced by a schedule with the same id and another value. The cancelled one delivers at most
    what was on its way (three seconds' worth at most however busy the machine), then nothing; the replaced one delivers only the new
    value from then on."""
    start = _next_second()
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (0, b"ended", _schedule(setup, b"to-cancel", start, b"1s")),
            (0, b"old", _schedule(setup, b"to-replace", start, b"1s")),
        ],
    )
    _start(setup, bridges)
    collector = setup.collector()
    target = setup.targets[0]
    try:
        collector.until(
            lambda rs: (
                min(Counter(r.delay_id for r in rs).values(), default=0) >= 2
                and len(Counter(r.delay_id for r in rs)) == 2
            ),
            60,
            "two occurrences of each",
        )
        produce_to(
            setup.services.bootstrap,
            setup.delay,
            [
                (0, None, [(H_CANCEL, b"to-cancel")]),
                (0, b"new", _schedule(setup, b"to-replace", _next_second(0), b"1s")),
            ],
        )
        told = time.time_ns() // 1_000_000
        _collect(collector, 6)
    finally:
        collector.close()
    cancelled = [r for r in collector.of(target) if r.delay_id == "to-cancel"]
    late = [r for r in cancelled if r.seen_ms > told + 3000]
    assert late == [], [(r.due_ms, r.seen_ms - told) for r in late]
    replaced = [r for r in collector.of(target) if r.delay_id == "to-replace"]
    after = [r.value for r in replaced if r.seen_ms > told + 3000]
    assert after and set(after) == {b"new"}, after
    twice = Counter((r.value, r.header(H_OCCURRENCE)) for r in replaced)
    assert max(twice.values()) == 1, twice


@pytest.mark.parametrize("policy, expected", [("latest", 1), ("all", 11), ("skip", 1)])
def test_occurrences_missed_before_the_bridge_got_to_them_follow_the_missed_policy(
    setup: Setup, bridges: list[Bridge], policy: str, expected: int
) -> None:
    """A schedule every second that started 10 s ago, with a max lateness of 2 s: its 11 past
    occurrences were missed. ``latest`` delivers the latest of them once, ``all`` every one in
    order, ``skip`` none of the missed (the latest, under a second late when the bridge gets to it,
    is not missed itself); from then on each occurrence comes at its instant."""
    now = time.time_ns() // 1_000_000
    start = now // 1000 * 1000 - 10_000
    headers = _schedule(
        setup, b"missed", start, b"1s", (H_MAX_LATENESS, b"2s"), (H_MISSED, policy.encode())
    )
    produce_to(setup.services.bootstrap, setup.delay, [(2, b"m", headers)])
    _start(setup, bridges)
    collector = setup.collector()
    target = setup.targets[0]
    try:
        collector.until(lambda rs: len(rs) >= expected + 2, 60, "the missed, then two on time")
    finally:
        collector.close()
    got = _occurrences(collector.of(target), target)
    first = got[0] if expected == 1 else start
    assert got == [first + k * 1000 for k in range(len(got))], got  # in order, none twice or left
    if expected == 1:  # the latest by the time the bridge got to it: none of the ten before
        assert got[0] >= now // 1000 * 1000, (got, now)
    assert got[-1] > now  # carried on after the outage


def test_a_paused_schedule_skips_its_occurrences_until_it_is_resumed(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Every second: paused after two occurrences, it delivers nothing for three seconds (once
    what was on its way is out, three seconds at most however busy the machine); resumed, it goes on at its next instant, and the occurrences
    that fell while it was paused are never delivered."""
    start = _next_second()
    produce_to(
        setup.services.bootstrap, setup.delay, [(0, b"p", _schedule(setup, b"held", start, b"1s"))]
    )
    _start(setup, bridges)
    collector = setup.collector()
    target = setup.targets[0]
    try:
        collector.until(lambda rs: len(rs) >= 2, 60, "two occurrences")
        produce_to(setup.services.bootstrap, setup.delay, [(0, None, [(H_PAUSE, b"held")])])
        paused = time.time_ns() // 1_000_000
        _collect(collector, 6)
        produce_to(setup.services.bootstrap, setup.delay, [(0, None, [(H_RESUME, b"held")])])
        resumed = time.time_ns() // 1_000_000
        collector.until(
            lambda rs: any(int(r.header(H_OCCURRENCE) or b"0") > resumed for r in rs),
            30,
            "an occurrence after the resume",
        )
    finally:
        collector.close()
    got = _occurrences(collector.of(target), target)
    assert got == sorted(set(got)), got
    held = [t for t in got if paused + 3000 < t <= resumed]
    assert held == [], (held, paused, resumed)  # skipped, and never delivered later
    assert [t for t in got if t > resumed], got

    # trace tells the steps that delivered nothing from the occurrences: carried on, not
    # delivered (to no place).
    def uses() -> list[dict[str, object]]:
        got = _cli(setup, "trace", "--id", "held", "--json")
        top = json.loads(got.stdout) if got.returncode == 0 else {}
        return [top, *top.get("uses", [])] if top else []

    wait_for(lambda: any(u["fate"] == "carried-on" for u in uses()), 30, "a step carried on")
    for use in uses():
        delivered = use.get("delivered")
        assert use["fate"] != "delivered" or (
            isinstance(delivered, dict) and delivered["partition"] >= 0
        )


def test_a_schedule_outlives_a_redis_that_lost_its_data(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Exactly once, a schedule every second for eight occurrences; Redis loses everything after
    the second. The bridge rebuilds from the delay topic and the journal: every occurrence is
    delivered, none twice."""
    start = _next_second()
    headers = _schedule(setup, b"durable", start, b"1s", (H_COUNT, b"8"))
    produce_to(setup.services.bootstrap, setup.delay, [(1, b"d", headers)])
    _start(setup, bridges, **EXACTLY_ONCE)
    collector = setup.collector()
    target = setup.targets[0]
    try:
        collector.until(lambda rs: len(rs) >= 2, 60, "two occurrences")
        assert wipe(setup) > 0
        collector.until(lambda rs: len(rs) >= 8, 90, "all eight occurrences")
        end = time.monotonic() + 2
        while time.monotonic() < end:
            collector.poll()
    finally:
        collector.close()
    assert sorted(_occurrences(collector.records, target)) == [start + k * 1000 for k in range(8)]


def test_exactly_once_each_occurrence_through_sigkills_and_a_redis_that_lost_its_data(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Twenty schedules every second, exactly once. The bridge is SIGKILLed and restarted twice
    and Redis loses everything once while they run: every occurrence of the twelve seconds
    watched is delivered, none twice, none early."""
    start = _next_second(3000)
    records: ToPartition = [
        (p % 3, b"c%d" % p, _schedule(setup, b"c%d" % p, start + p * 50, b"1s")) for p in range(20)
    ]
    produce_to(setup.services.bootstrap, setup.delay, records)
    bridge = _start(setup, bridges, **EXACTLY_ONCE)
    collector = setup.collector()
    try:
        for moment, fault in ((3000, "kill"), (6000, "wipe"), (9000, "kill")):
            while time.time_ns() // 1_000_000 < start + moment:
                collector.poll()
            if fault == "kill":
                bridge.kill()
                bridge = _start(setup, bridges, **EXACTLY_ONCE)
            else:
                assert wipe(setup) > 0
        expected = {(f"c{p}", start + p * 50 + k * 1000) for p in range(20) for k in range(12)}

        missing = set(expected)

        def all_in(rs: list[Received]) -> bool:
            missing.difference_update((r.delay_id, int(r.header(H_OCCURRENCE) or b"0")) for r in rs)
            return not missing

        try:
            collector.until(all_in, 120, "every occurrence of the twelve seconds")
        except AssertionError as e:
            absent = sorted((at - start, sid) for sid, at in missing)
            raise AssertionError(
                f"{e}; missing (ms after the first, delay-id): {absent[:40]}"
            ) from e
        _collect(collector, 2)  # a second copy would be in by now
    finally:
        collector.close()
    got = Counter(
        (r.delay_id, int(r.header(H_OCCURRENCE) or b"0"))
        for r in collector.of(setup.targets[0])
        if r.header(H_OCCURRENCE) is not None
    )
    twice = {k: n for k, n in got.items() if n > 1}
    assert twice == {}, (sorted(twice.items())[:10], f"positions read again: {collector.again}")
    assert all(r.seen_ms >= r.due_ms for r in collector.of(setup.targets[0]))


def test_each_zones_clock_changes_end_to_end(setup: Setup, bridges: list[Bridge]) -> None:
    """The unit tests' DST cases (tests/unit/test_recurring.py), each a schedule on the real
    servers that started in the past with ``delay-missed: all`` and as many occurrences as the
    case writes out: the bridge delivers them at once, in order, each once, at the instants the
    case expects — through Paris's, New York's and Lord Howe's (30-minute) changes, Kathmandu's
    +05:45 and Tokyo's none."""
    now = time.time_ns() // 1_000_000
    cases = [c for c in CASES if max(_utc_ms(t) for t in c[3]) < now]
    assert len(cases) >= 10
    records: ToPartition = []
    for n, (expression, zone, start, expected) in enumerate(cases):
        headers: Headers = [
            (H_TARGET_TOPIC, setup.targets[0].encode()),
            (H_CRON, expression.encode()),
            (H_TIMEZONE, zone.encode()),
            (H_ID, b"dst-%d" % n),
            (H_DELIVER_AT, str(ms(start)).encode()),
            (H_COUNT, str(len(expected)).encode()),
            (H_MISSED, b"all"),
        ]
        records.append((n % 3, b"dst", headers))
    produce_to(setup.services.bootstrap, setup.delay, records)
    _start(setup, bridges)
    total = sum(len(c[3]) for c in cases)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= total, 120, f"{total} occurrences")
        _collect(collector, 2)  # one too many would be in by now
    finally:
        collector.close()
    target = setup.targets[0]
    for n, (expression, zone, _, expected) in enumerate(cases):
        got = _occurrences(collector.of(target), target, f"dst-{n}")
        assert got == [_utc_ms(t) for t in expected], (expression, zone, got)


def _utc_ms(text: str) -> int:
    """``2026-03-28T01:30Z`` as epoch ms."""
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC).timestamp() * 1000)


def test_a_schedule_outlives_the_delay_topics_retention(
    one: Setup, bridges: list[Bridge], admin: AdminClient, redis_client: redis.Redis
) -> None:
    """Exactly once, every second: after three occurrences every record of the delay topic
    below the one that holds the schedule now is deleted (as retention does), and then Redis
    loses everything. Rebuilt from what is left, the schedule goes on: three more occurrences,
    none twice."""
    start = _next_second()
    produce_to(
        one.services.bootstrap, one.delay, [(0, b"r", _schedule(one, b"kept", start, b"1s"))]
    )
    _start(one, bridges, **EXACTLY_ONCE)
    collector = one.collector()
    target = one.targets[0]
    try:
        collector.until(lambda rs: len(rs) >= 3, 60, "three occurrences")
        shard = Shard(one.delay, 0)
        at = Store(redis_client, f"test-{one.unique}").registry.at([shard])[shard]
        assert len(at) == 1
        for future in admin.delete_records([TopicPartition(one.delay, 0, min(at))]).values():
            future.result(timeout=30)
        deleted = time.time_ns() // 1_000_000
        assert wipe(one) > 0
        collector.until(
            lambda rs: len([r for r in rs if r.seen_ms > deleted + 500]) >= 3,
            60,
            "three occurrences after the retention and the loss",
        )
        _collect(collector, 2)
    finally:
        collector.close()
    got = _occurrences(collector.of(target), target)
    assert got == sorted(set(got)), got  # none twice, in order
    assert got[0] == start and len(got) >= 6


def test_a_schedule_whose_occurrences_are_further_apart_than_limits_max_delay_goes_on(
    one: Setup, bridges: list[Bridge], admin: AdminClient, redis_client: redis.Redis
) -> None:
    """Exactly once, every 6 s with ``limits.max_delay`` 4 s: no record may wait longer than 4 s,
    so the schedule is carried on at half of it between its occurrences (a yearly schedule under
    the default 365 days, a monthly one under 30). After the first occurrence, once a record
    carried on with no occurrence holds the schedule, every record below it is deleted (as
    retention does) and Redis loses everything: each occurrence comes once at its instant, and
    nothing reaches the DLQ."""
    start = _next_second()
    sid = b"far-apart"
    headers = _schedule(one, sid, start, b"6s", (H_COUNT, b"3"))
    produce_to(one.services.bootstrap, one.delay, [(0, b"f", headers)])
    overrides = {**EXACTLY_ONCE, "limits__max_delay": "4s"}
    _start(one, bridges, **overrides)
    collector = one.collector()
    target = one.targets[0]
    shard = Shard(one.delay, 0)
    registry = Store(redis_client, f"test-{one.unique}").registry

    def held_at() -> int:
        return min(registry.at([shard])[shard] or [-1])

    try:
        collector.until(lambda rs: len(rs) >= 1, 60, "the first occurrence")
        # Carried on twice since (at 2 s and 4 s), the next occurrence not due yet.
        wait_for(lambda: held_at() >= 3, 20, f"a record carried on between: {held_at()}")
        for future in admin.delete_records([TopicPartition(one.delay, 0, held_at())]).values():
            future.result(timeout=30)
        assert wipe(one) > 0
        collector.until(lambda rs: len(rs) >= 3, 60, f"three occurrences: {collector.records}")
        _collect(collector, 2)
    finally:
        collector.close()
    got = collector.of(target)
    assert _occurrences(got, target) == [start, start + 6000, start + 12000]
    assert all(r.seen_ms >= r.due_ms for r in got)
    assert collector.of(one.dlq) == []


def test_a_schedule_further_apart_than_the_payload_horizon_waits_as_a_reference(
    one: Setup, bridges: list[Bridge], redis_client: redis.Redis
) -> None:
    """Every 9 s, 4 KiB, with ``store.payload_horizon`` 4 s: between its occurrences the
    schedule's record waits as a reference (its payload left in the delay topic, not in Redis)
    and is read back before each. Every occurrence comes with the payload, once, at its instant;
    then Redis is lost while it waits so, and it goes on."""
    start = _next_second()
    payload = bytes(range(256)) * 16
    headers = _schedule(one, b"far-ref", start, b"9s", (H_COUNT, b"4"))
    produce_to(one.services.bootstrap, one.delay, [(0, payload, headers)])
    bridge = _start(one, bridges, **EXACTLY_ONCE, **TIERS)
    collector = one.collector()
    target = one.targets[0]
    store = Store(redis_client, f"test-{one.unique}")
    shard = Shard(one.delay, 0)
    try:
        collector.until(lambda rs: len(rs) >= 1, 60, "the first occurrence")
        wait_for(lambda: store.references.counts([shard]) == {shard: 1}, 10, "a reference")
        collector.until(lambda rs: len(rs) >= 2, 30, "the second occurrence")
        wait_for(lambda: store.references.counts([shard]) == {shard: 1}, 10, "a reference again")
        assert wipe(one) > 0
        collector.until(lambda rs: len(rs) >= 4, 60, "four occurrences")
        _collect(collector, 2)
    finally:
        collector.close()
    got = collector.of(target)
    assert _occurrences(got, target) == [start + k * 9000 for k in range(4)]
    assert all(r.value == payload and r.seen_ms >= r.due_ms for r in got)
    assert metric(bridge, 'delay_bridge_read_back_total{result="stored"}') >= 1
    assert collector.of(one.dlq) == []


def _cli(setup: Setup, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        cwd=ROOT,
        env=setup.bridge().env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_line_makes_lists_pauses_resumes_and_cancels_a_schedule(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """``produce --cron --tz --id`` schedules it and says when it next occurs; ``schedules list``
    shows it with its next three occurrences in its zone and in UTC; ``schedules pause`` and
    ``resume`` mark it; ``cancel --id`` ends it and the list is empty again. A schedule without
    an id is refused before anything is sent."""
    _start(setup, bridges)
    target = setup.targets[0]
    refused = _cli(setup, "produce", "--target", target, "--every", "1h", "v")
    assert refused.returncode == 2 and "--id is required" in refused.stderr, refused.stderr
    made = _cli(
        setup,
        "produce",
        "--target",
        target,
        "--cron",
        "0 9 * * 1-5",
        "--tz",
        "Europe/Paris",
        "--id",
        "digest",
        "--key",
        "d",
        "hello",
    )
    assert made.returncode == 0, made.stderr
    assert made.stderr.count("occurs ") == 3 and "T09:00:00+0" in made.stderr, made.stderr

    def listed() -> str:
        got = _cli(setup, "schedules", "list")
        return got.stdout if got.returncode == 0 else ""

    wait_for(lambda: "digest: cron '0 9 * * 1-5' in Europe/Paris" in listed(), 30, "listed")
    text = listed()
    assert text.count("  next ") == 3 and "T09:00:00+0" in text and "paused" not in text, text
    assert _cli(setup, "schedules", "pause", "--id", "digest").returncode == 0
    wait_for(lambda: "(paused" in listed(), 30, "listed as paused")
    assert _cli(setup, "schedules", "resume", "--id", "digest").returncode == 0
    wait_for(lambda: "(paused" not in listed() and "digest" in listed(), 30, "resumed")
    assert _cli(setup, "cancel", "--id", "digest").returncode == 0
    wait_for(lambda: _cli(setup, "schedules", "list").returncode == 1, 30, "no schedule left")
    unknown = _cli(setup, "schedules", "pause", "--id", "nothing")
    assert unknown.returncode != 0 and "no recurring schedule" in unknown.stderr, unknown.stderr


def test_cancel_ends_a_schedule_whose_occurrence_is_in_flight(
    setup: Setup, bridges: list[Bridge], redis_client: redis.Redis
) -> None:
    """``cancel --id`` while the schedule's record is claimed (its occurrence in flight at
    another replica): nothing of it waits, but its partition's registry has it live, so the
    cancel goes there — not to the partition its key maps to — and ends it."""
    start = _next_second(3_600_000)
    headers = _schedule(setup, b"in-flight", start, b"1h")
    produce_to(setup.services.bootstrap, setup.delay, [(2, b"i", headers)])
    bridge = _start(setup, bridges)
    wait_for(lambda: metric(bridge, 'delay_bridge_schedules{state="running"}') == 1, 30, "stored")
    store = Store(redis_client, f"test-{setup.unique}")
    shard = Shard(setup.delay, 2)
    claimed = store.claim([shard], 10, 3_600_000, now_ms=start)  # in flight elsewhere, an hour
    assert [c.record.delay_id for c in claimed] == ["in-flight"]
    assert partition_for(b"elsewhere", 3) != 2
    done = _cli(setup, "cancel", "--id", "in-flight", "--key", "elsewhere")
    assert done.returncode == 0, done.stderr
    assert "partition 2" in done.stderr, done.stderr
    wait_for(lambda: metric(bridge, 'delay_bridge_schedules{state="running"}') == 0, 30, "ended")
    assert store.registry.live([shard], "in-flight") == []


def test_fire_and_reschedule_leave_a_recurring_schedule_alone(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """``fire`` and ``reschedule`` move one-shot records: by id, a schedule is refused with what
    to do instead; by a filter that matches one, it is left alone and said so, while the
    one-shot records beside it are fired. The schedule's next occurrence is unchanged."""
    start = _next_second(3_600_000)
    target = setup.targets[0]
    one_shots: ToPartition = [
        (0, b"one", [(H_TARGET_TOPIC, target.encode()), (H_DELIVER_AT, str(start).encode())])
        for _ in range(3)
    ]
    schedule = (0, b"s", _schedule(setup, b"hourly", start, b"1h"))
    produce_to(setup.services.bootstrap, setup.delay, [schedule, *one_shots])
    bridge = _start(setup, bridges)
    wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 4, 30, "all four stored")
    for verb in (["fire"], ["reschedule", "--at", str(start + 60_000)]):
        refused = _cli(setup, *verb, "--id", "hourly")
        assert refused.returncode == 2, refused.stderr
        assert "hourly is a recurring schedule" in refused.stderr, refused.stderr
    fired = _cli(setup, "fire", "--target", target, "--yes")
    assert fired.returncode == 0, fired.stderr
    assert "1 recurring schedule matched: left as it is" in fired.stderr, fired.stderr
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 3, 30, "the three one-shot records fired")
        _collect(collector, 2)
    finally:
        collector.close()
    assert [r.value for r in collector.of(target)] == [b"one"] * 3
    listed = _cli(setup, "schedules", "list")
    assert f"next {datetime.fromtimestamp(start / 1000, UTC):%Y-%m-%dT%H:%M:%S}" in listed.stdout, (
        listed.stdout
    )


def test_trace_tells_a_schedules_occurrences_apart(setup: Setup, bridges: list[Bridge]) -> None:
    """``trace --id`` of a schedule that ran three times: each record that carried it is a use
    of its id, each delivered, due at its own occurrence."""
    start = _next_second()
    headers = _schedule(setup, b"traced", start, b"1s", (H_COUNT, b"3"))
    produce_to(setup.services.bootstrap, setup.delay, [(2, b"t", headers)])
    _start(setup, bridges)
    setup.await_value(b"t", 30, "the first occurrence")
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 3, 30, "three occurrences")
    finally:
        collector.close()

    def traced() -> list[tuple[str, int]]:
        got = _cli(setup, "trace", "--id", "traced", "--json")
        if got.returncode != 0:
            return []
        top = json.loads(got.stdout)
        return sorted(
            (use["fate"], next(e["due"] for e in use["events"] if "due" in e))
            for use in [top, *top.get("uses", [])]
        )

    want = [("delivered", start + k * 1000) for k in range(3)]
    wait_for(lambda: traced() == want, 30, f"three uses delivered: {traced()}")


def _collect(collector: Collector, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        collector.poll()


RUNNING = 'delay_bridge_schedules{state="running"}'


def _ticking(setup: Setup, bridges: list[Bridge], count: int) -> Bridge:
    """A consuming bridge running ``count`` schedules every second (ids ``tick-<i>``) across the
    delay topic's three partitions, once each has delivered twice."""
    bridge = _consuming(setup, bridges)
    start = _next_second(3000)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [
            (i % 3, b"tick", _schedule(setup, f"tick-{i}".encode(), start, b"1s"))
            for i in range(count)
        ],
    )
    wait_for(lambda: metric(bridge, RUNNING) == count, 60, "every schedule running")
    delivered = "delay_bridge_delivered_total"
    wait_for(lambda: metric(bridge, delivered) >= 2 * count, 60, "two occurrences of each")
    return bridge


def _collected(setup: Setup, seconds: float) -> Collector:
    """What the targets and the DLQ hold, read for ``seconds``."""
    collector = setup.collector()
    try:
        _collect(collector, seconds)
    finally:
        collector.close()
    return collector


def test_a_bulk_cancel_ends_every_schedule_it_matched_however_far_each_moved_on(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A thousand schedules every second across the delay topic's partitions, cancelled by a
    filter while they run: each moves on to a new record every second, so many have moved on
    from the record the bulk matched by the time its cancel is read. Every one ends — the gauge
    goes to 0 — and no occurrence comes after what was on its way when the cancels were read."""
    bridge = _ticking(setup, bridges, 1000)
    cancelled = _cli(setup, "cancel", "--target", setup.targets[0], "--yes")
    assert cancelled.returncode == 0, cancelled.stderr
    done_ms = time.time_ns() // 1_000_000
    wait_for(lambda: metric(bridge, RUNNING) == 0, 30, "every schedule ended")
    collector = _collected(setup, 3)
    late = [o for o in _occurrences(collector.records, setup.targets[0]) if o > done_ms + 1000]
    assert late == [], late[:5]


def _released(hold: Path) -> None:
    """Let what a fault hook holds in ``hold`` go on."""
    (hold / "release").touch()


def _ended_after(setup: Setup, bridge: Bridge, sid: str, last_ms: int) -> None:
    """Every schedule of ``bridge`` ended, and no occurrence of ``sid`` after ``last_ms`` came."""
    wait_for(lambda: metric(bridge, RUNNING) == 0, 30, "every schedule ended")
    late = [o for o in _occurrences(_collected(setup, 3).records, setup.targets[0], sid)]
    assert [o for o in late if o > last_ms] == [], late


def test_a_bulk_cancel_ends_a_schedule_whose_occurrence_was_in_flight_when_it_looked(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A schedule every second whose record the mover claimed and holds — in flight in Redis,
    waiting in no index — while a bulk cancel by its target looks, beside ten schedules that
    wait: the bulk ends it as well as them. Once the mover goes on, nothing of it comes after the
    occurrence that was on its way."""
    hold = setup.tmp / "hold"
    hold.mkdir()
    bridge = setup.bridge()
    bridge.env = with_faults(bridge.env, HOLD_CLAIMED_VALUE="held", HOLD_DIR=str(hold))
    bridges.append(bridge.start())
    assert wait_ready(bridge), bridge.output()
    wait_for(lambda: metric(bridge, "delay_bridge_owned_partitions") >= 1, 60, "its partitions")
    start = _next_second(2000)
    hourly = [
        (i % 3, b"tick", _schedule(setup, b"tick-%d" % i, start + 3_600_000, b"1h"))
        for i in range(10)
    ]
    held = (0, b"held", _schedule(setup, b"held-0", start, b"1s"))
    produce_to(setup.services.bootstrap, setup.delay, [held, *hourly])
    wait_for((hold / "held").exists, 30, "the mover holding held-0's first occurrence")
    try:
        cancelled = _cli(setup, "cancel", "--target", setup.targets[0], "--yes")
    finally:
        _released(hold)
    assert cancelled.returncode == 0, cancelled.stderr
    _ended_after(setup, bridge, "held-0", start)


def test_a_bulk_cancel_ends_a_schedule_that_moved_on_to_a_record_stored_after_its_snapshot(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A bulk cancel by target takes its snapshot and, before it looks, a schedule every second
    delivers an occurrence and moves on to a record stored after that snapshot: the bulk ends it
    all the same — it matched the schedule, whichever record carries it now."""
    bridge = _consuming(setup, bridges)
    start = _next_second(2000)
    produce_to(
        setup.services.bootstrap,
        setup.delay,
        [(0, b"moved", _schedule(setup, b"moved-0", start, b"1s"))],
    )
    delivered = "delay_bridge_delivered_total"
    wait_for(lambda: metric(bridge, delivered) >= 1, 30, "its first occurrence")
    hold = setup.tmp / "hold"
    hold.mkdir()
    command = [sys.executable, "-m", "bridge", "cancel", "--target", setup.targets[0], "--yes"]
    env = with_faults(setup.bridge().env, HOLD_BULK_DIR=str(hold))
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as cli:
        try:
            wait_for((hold / "held").exists, 30, "the bulk cancel's snapshot taken")
            seen = metric(bridge, delivered)
            # Two more occurrences: the record carrying the first of them on was stored after
            # the snapshot.
            wait_for(lambda: metric(bridge, delivered) >= seen + 2, 30, "the schedule moved on")
        finally:
            _released(hold)
        out, err = cli.communicate(timeout=60)
    assert cli.returncode == 0, err
    assert "1 waiting record" in out, out
    _ended_after(setup, bridge, "moved-0", time.time_ns() // 1_000_000 + 1000)


def test_a_bulk_reschedule_beside_a_thousand_schedules_moves_only_the_one_shots(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A thousand schedules every second and a thousand one-shot records due in an hour, all
    bound for one target; a bulk reschedule by that target, 3 s on. It moves each one-shot record
    once — delivered once, not before its new time — and leaves every schedule as it is: each
    still running, none losing or repeating an occurrence, however many of their records moved on
    while the bulk ran. (A bulk fire takes the same path through the matches: the adversary's
    operator runs both beside its schedules.)"""
    verb = ["reschedule", "--after", "3s"]
    count = 1000
    bridge = _ticking(setup, bridges, count)
    target = setup.targets[0]
    later = str(time.time_ns() // 1_000_000 + 3_600_000).encode()
    one_shots: ToPartition = [
        (i % 3, f"one-{i}".encode(), [(H_TARGET_TOPIC, target.encode()), (H_DELIVER_AT, later)])
        for i in range(count)
    ]
    produce_to(setup.services.bootstrap, setup.delay, one_shots)

    def matched() -> str:
        dry = _cli(setup, *verb, "--target", target, "--dry-run")
        return dry.stdout + "\n" + dry.stderr

    # The schedules' records wait between their steps, and the dry run says it would leave
    # them; a busy machine may hold every one in flight for a moment (the real run then
    # matches fewer: what it must do to them is the same, nothing).
    wait_for(
        lambda: (
            f"{count:,} waiting records" in (m := matched())
            and "recurring schedules matched: left as they are" in m
        ),
        60,
        "the one-shots stored, beside waiting schedules",
    )
    moved_ms = time.time_ns() // 1_000_000
    moved = _cli(setup, *verb, "--target", target, "--yes")
    assert moved.returncode == 0, moved.stderr
    assert f"{count:,} waiting records" in moved.stdout, moved.stdout
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(_one_shots(rs)) >= count, 60, "every one-shot delivered")
        _collect(collector, 3)
    finally:
        collector.close()
    assert metric(bridge, RUNNING) == count
    delivered = _one_shots(collector.of(target))
    assert sorted(r.value or b"" for r in delivered) == sorted(v or b"" for _, v, _ in one_shots)
    early = [r.value for r in delivered if r.timestamp_ms < moved_ms + 3000]
    assert early == [], early[:5]
    occurrences = [
        (r.delay_id, int(r.header(H_OCCURRENCE) or b"-1"))
        for r in collector.of(target)
        if r.delay_id.startswith("tick-")
    ]
    twice = [o for o, n in Counter(occurrences).items() if n > 1]
    assert twice == [], twice[:5]
    for sid in (f"tick-{i}" for i in range(count)):  # none lost one: each second, each schedule
        instants = sorted(o for d, o in occurrences if d == sid)
        gaps = [b - a for a, b in itertools.pairwise(instants) if b - a != 1000]
        assert gaps == [], (sid, gaps)


def _one_shots(records: list[Received]) -> list[Received]:
    return [r for r in records if (r.value or b"").startswith(b"one-")]


def test_cancels_read_in_other_partitions_end_every_schedule_wherever_it_was(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """Three hundred schedules every second; each cancelled by a record produced to another
    partition than its own, the cancels spread over a second so that some find their schedule's
    record waiting, some its occurrence in flight, some between its occurrence and the record
    carrying it on. Every schedule ends, and none delivers an occurrence due after its cancel
    was produced, but what was on its way."""
    count, groups = 300, 10
    bridge = _ticking(setup, bridges, count)
    cancelled_ms: dict[str, int] = {}
    per_group = count // groups
    for g in range(groups):
        batch = range(g * per_group, (g + 1) * per_group)
        produce_to(
            setup.services.bootstrap,
            setup.delay,
            [((i + 1) % 3, b"", [(H_CANCEL, f"tick-{i}".encode())]) for i in batch],
        )
        now = time.time_ns() // 1_000_000
        cancelled_ms.update({f"tick-{i}": now for i in batch})
        time.sleep(1 / groups)  # spread over a second: not a wait for a condition
    wait_for(lambda: metric(bridge, RUNNING) == 0, 30, "every schedule ended")
    collector = _collected(setup, 3)
    late = [
        (r.delay_id, o)
        for r in collector.of(setup.targets[0])
        if (o := int(r.header(H_OCCURRENCE) or b"0")) > cancelled_ms[r.delay_id or ""] + 1000
    ]
    assert late == [], late[:5]
