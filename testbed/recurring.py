"""Recurring schedules under faults, and the oracle of their occurrences.

A recurring schedule's occurrences are not records of the workload: the checker skips the
schedule's own records (testbed.checker.expectations), and this module says what each schedule
should have delivered — every occurrence in a window, each once — and reads the target topic
for what it did. The ``recurring-sigkill`` chaos scenario and ``python -m bench recurring``
both account with it.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import Consumer, KafkaError, Message, Producer

from bridge.kafka import headers_of
from bridge.kafka import produce as produce_one
from bridge.message import (
    H_CANCEL,
    H_COUNT,
    H_CRON,
    H_DELIVER_AT,
    H_EVERY,
    H_ID,
    H_MISSED,
    H_OCCURRENCE,
    H_TARGET_TOPIC,
    Headers,
)
from bridge.store import Shard, Store
from testbed import run as runs
from testbed.checker import in_flight, read_topic
from testbed.run import PARTITIONS, Result, Run, Size
from testbed.workload import CLIENT_LOG_LEVEL, ReadOnce, now_ms, steady

VALUE = b"x" * 100
MINUTE_MS = 60_000

Occurrence = tuple[str, int]  # (the schedule's delay-id, the instant, epoch ms)


@dataclass
class Occurrences:
    """What the target topic holds of the occurrences expected: the first append time of each
    one seen, and how many times each came."""

    seen: dict[Occurrence, int] = field(default_factory=dict)
    copies: Counter[Occurrence] = field(default_factory=Counter)

    def missed(self, expected: list[Occurrence]) -> list[Occurrence]:
        return [k for k in expected if k not in self.seen]

    def early(self, expected: list[Occurrence]) -> list[Occurrence]:
        return [k for k in expected if k in self.seen and self.seen[k] < k[1]]

    def twice(self) -> list[Occurrence]:
        return sorted(k for k, n in self.copies.items() if n > 1)

    def stray(self, faults: Sequence[tuple[int, int]]) -> list[Occurrence]:
        """Of :meth:`twice`, those whose first copy was in flight at none of ``faults`` (when
        each began and ended: :func:`~testbed.checker.in_flight`) — by when it came, not when it
        was due: one held up until just before a fault is as much in flight at it."""
        return [k for k in self.twice() if not in_flight(self.seen[k], faults)]


def produce_schedules(
    bootstrap: str, topic: str, target: str, schedules: list[tuple[bytes, Headers]]
) -> None:
    """Produce each ``(delay-id, headers)`` schedule to ``topic``, keyed by its id, for
    ``target``."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "log_level": CLIENT_LOG_LEVEL,
        }
    )
    for i, (sid, own) in enumerate(schedules):
        headers = [(H_TARGET_TOPIC, target.encode()), (H_ID, sid), *own]
        produce_one(producer, topic, key=sid, value=VALUE, headers=headers)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the schedules were not all produced")


def spread(
    count: int, first_ms: int, every_ms: int, prefix: str = "s"
) -> list[tuple[bytes, Headers]]:
    """``count`` schedules every ``every_ms``, their first occurrences spread evenly over one
    interval from ``first_ms``."""
    return [
        (
            f"{prefix}{i}".encode(),
            [
                (H_EVERY, f"{every_ms}ms".encode()),
                (H_DELIVER_AT, b"%d" % (first_ms + i * every_ms // count)),
            ],
        )
        for i in range(count)
    ]


def expected_spread(
    count: int, first_ms: int, every_ms: int, start: int, end: int, prefix: str = "s"
) -> list[Occurrence]:
    """Every occurrence of :func:`spread`'s schedules due in ``start`` .. ``end``."""
    out = []
    for i in range(count):
        at = first_ms + i * every_ms // count
        at += max(0, (start - at + every_ms - 1) // every_ms) * every_ms
        while at < end:
            out.append((f"{prefix}{i}", at))
            at += every_ms
    return out


def _from_the_start(bootstrap: str, target: str) -> Consumer:
    """A consumer of ``target`` from its beginning, committed records only, in a group of its
    own."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"occurrences-{target}-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": CLIENT_LOG_LEVEL,
        }
    )
    consumer.subscribe([target])
    return consumer


def read_occurrences(
    bootstrap: str,
    target: str,
    expected: list[Occurrence],
    deadline_ms: int,
    optional: frozenset[str] = frozenset(),
) -> Occurrences:
    """Read ``target`` from its beginning (``read_committed``) for the ``expected`` occurrences:
    until all have come — but those of the schedules ``optional`` names, which may not — and a
    second more has passed (a second copy would be in by then), or ``deadline_ms``."""
    wanted = set(expected)
    required = len([k for k in wanted if k[0] not in optional])
    consumer = _from_the_start(bootstrap, target)
    got = Occurrences()
    read = ReadOnce()
    all_in: float | None = None
    try:
        while now_ms() < deadline_ms and (all_in is None or time.time() < all_in + 1):
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None or not read.first(msg):
                    continue
                headers = dict(headers_of(msg))
                occurrence = headers.get(H_OCCURRENCE)
                if occurrence is None:
                    continue
                key = ((headers.get(H_ID) or b"").decode(), int(occurrence))
                if key not in wanted:
                    continue
                got.copies[key] += 1
                if key not in got.seen:
                    got.seen[key] = msg.timestamp()[1]
                    required -= key[0] not in optional
            if all_in is None and required == 0:
                all_in = time.time()
    finally:
        consumer.close()
    return got


def counted_schedules(
    run: Run, schedules: int, every_ms: int, occurrences: int, first_ms: int
) -> list[Occurrence]:
    """Produce ``schedules`` schedules (ids ``c<i>``) every ``every_ms``, their first
    occurrences spread over one interval from ``first_ms``, ``occurrences`` each
    (``delay-count``) and ``delay-missed: all``; returns every occurrence they must deliver."""
    made = [
        (sid, [*own, (H_COUNT, b"%d" % occurrences), (H_MISSED, b"all")])
        for sid, own in spread(schedules, first_ms, every_ms, "c")
    ]
    produce_schedules(run.servers.bootstrap, run.delay, run.target, made)
    return [
        (f"c{i}", first_ms + i * every_ms // schedules + k * every_ms)
        for i in range(schedules)
        for k in range(occurrences)
    ]


def recurring_sigkill(run: Run, size: Size, rng: random.Random) -> Result:
    """Recurring schedules through a SIGKILL just after each minute boundary and one Redis
    FLUSHALL (#81's target): ``size.records`` // 100 schedules firing at every minute (a cron
    ``* * * * *``, all at once) and as many every 10 s spread over it, all ``delay-missed:
    all``, beside a steady load of one-shot records. Every occurrence of the window is
    delivered, none early; exactly once, none twice; at least once, only one in flight at a
    fault comes again."""
    bridge = run.bridge("pod-0")
    count = max(10, size.records // 100)
    first = (now_ms() + 20_000) // MINUTE_MS * MINUTE_MS + MINUTE_MS
    every = [(sid, [*h, (H_MISSED, b"all")]) for sid, h in spread(count, first, 10_000, "e")]
    minute: list[tuple[bytes, Headers]] = [
        (b"m%d" % i, [(H_CRON, b"* * * * *"), (H_DELIVER_AT, b"%d" % first), (H_MISSED, b"all")])
        for i in range(count)
    ]
    produce_schedules(run.servers.bootstrap, run.delay, run.target, every + minute)
    end = first + int(size.seconds * 1000)
    workload = run.workload(
        steady(size.records, run.target, 5000, rng.randrange(1 << 30)), size.seconds
    )
    # (epoch ms, fault): a SIGKILL within half a second after each minute boundary (the minute's
    # occurrences in flight), and a FLUSHALL half a minute after the middle one.
    events = [
        (first + k * MINUTE_MS + rng.randrange(0, 500), "kill") for k in range(1, size.faults + 1)
    ]
    events.append((first + (size.faults // 2) * MINUTE_MS + 30_000, "wipe"))
    for at, fault in sorted(events):
        if at >= end:
            break
        _until(at)
        if fault == "wipe":
            client = run.servers.redis()
            client.flushall()
            client.close()
            run.fault_over("FLUSHALL")
            continue
        bridge.kill()
        bridge = run.bridge("pod-0")
        run.fault_over(f"SIGKILL at {at % MINUTE_MS} ms past the minute")
    kills = len(run.faults) - 1  # one of them the FLUSHALL
    result = run.finish(workload, "recurring SIGKILL", f"{kills} x SIGKILL at a minute, FLUSHALL")
    expected = expected_spread(count, first, 10_000, first, end, "e")
    expected += [(f"m{i}", at) for i in range(count) for at in range(first, end, MINUTE_MS)]
    check_occurrences(run, result, expected, f"{2 * count:,} schedules")
    return result


def check_occurrences(run: Run, result: Result, expected: list[Occurrence], what: str) -> None:
    """Read the run's target for the ``expected`` occurrences (of ``what``) and add the checks:
    every one delivered (but those of a schedule a record of the delay topic named by its
    origin: see :func:`named_by_origin`), none early (by the broker's append time), none twice
    exactly once, and at least once only one in flight at one of the run's faults
    (:meth:`Occurrences.stray`)."""
    hit = named_by_origin(read_topic(run.servers.bootstrap, run.delay, PARTITIONS), run.delay)
    got = read_occurrences(
        run.servers.bootstrap, run.target, expected, now_ms() + 120_000, frozenset(hit)
    )
    missed = [k for k in got.missed(expected) if k[0] not in hit]
    early, twice = got.early(expected), got.twice()
    stray = got.stray(run.faults)
    result.checks["every occurrence delivered"] = not missed
    result.checks["no occurrence early"] = not early
    result.checks["an occurrence twice only when in flight at a fault"] = not stray
    if runs.EXACTLY_ONCE:
        result.checks["no occurrence twice (exactly once)"] = not twice
    result.notes.append(
        f"{len(expected):,} occurrences of {what}: {len(missed)} missed, {len(early)} early, "
        f"{len(twice)} twice" + (f"; {len(hit)} cancelled or replaced by origin" if hit else "")
    )
    for name, keys in (("missed", missed), ("early", early), ("twice", twice)):
        if keys:
            print(f"   {name}: {keys[:10]}", file=sys.stderr, flush=True)


def named_by_origin(messages: list[Message], delay: str) -> set[str]:
    """The schedules (delay-ids) one of whose records a cancel or a record of ``messages`` (the
    delay topic's) names by its origin, ``<topic>:<partition>:<offset>`` (an adversary's default
    ids): withdrawn if it waited then, so its occurrences from then on may not come."""
    origins: dict[str, str] = {}
    named: set[str] = set()
    for msg in messages:
        headers = headers_of(msg)
        names = {k for k, _ in headers}
        given = dict(headers).get(H_ID)
        if given is not None and not names.isdisjoint((H_CRON, H_EVERY)):
            origins[f"{delay}:{msg.partition()}:{msg.offset()}"] = given.decode()
        named |= {(v or b"").decode(errors="replace") for k, v in headers if k in (H_CANCEL, H_ID)}
    return {sid for origin, sid in origins.items() if origin in named}


def _until(epoch_ms: int) -> None:
    """Wait until the wall clock reads ``epoch_ms`` (fault timing against the schedules' own
    instants, not synchronisation)."""
    left = epoch_ms - now_ms()
    if left > 0:
        time.sleep(left / 1000)


@dataclass
class Cancelling:
    """Schedules with no end (ids ``x<i>``), cancelled one at a time by records keyed at random
    (most read in another partition than the schedule's), then checked to have ended."""

    run: Run
    left: list[str]
    produced: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> its cancel's place

    @classmethod
    def start(cls, run: Run, schedules: int, every_ms: int, first_ms: int) -> Cancelling:
        """Produce ``schedules`` of them every ``every_ms`` from ``first_ms``."""
        made = [
            (sid, [*own, (H_MISSED, b"all")])
            for sid, own in spread(schedules, first_ms, every_ms, "x")
        ]
        produce_schedules(run.servers.bootstrap, run.delay, run.target, made)
        return cls(run, [sid.decode() for sid, _ in made])

    def cancel(self, rng: random.Random, every: bool = False) -> None:
        """Cancel one of those left (``every``: all of them)."""
        ids, self.left = (self.left, []) if every else (self.left[-1:], self.left[:-1])
        self.produced |= cancel_schedules(self.run, ids, rng)

    def check(self, result: Result) -> None:
        """The check that each ended: see :func:`check_cancelled`."""
        check_cancelled(self.run, result, self.produced)


def cancel_schedules(run: Run, ids: list[str], rng: random.Random) -> dict[str, tuple[int, int]]:
    """Cancel each of ``ids`` by a record keyed at random (most land in another partition than
    the schedule's); returns where each cancel is: its partition and offset."""
    producer = Producer({"bootstrap.servers": run.servers.bootstrap, "log_level": CLIENT_LOG_LEVEL})
    placed: dict[str, tuple[int, int]] = {}

    def report(sid: str) -> Callable[[KafkaError | None, Message], None]:
        def placed_at(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                placed[sid] = (msg.partition() or 0, msg.offset() or 0)

        return placed_at

    for sid in ids:
        key = rng.choice([None, b"k", b"customer-1", sid.encode()])
        cancel = [(H_CANCEL, sid.encode())]
        produce_one(
            producer, run.delay, key=key, value=b"", headers=cancel, on_delivery=report(sid)
        )
    if producer.flush(60) or len(placed) < len(ids):
        raise RuntimeError("the cancels were not all produced")
    return placed


def check_cancelled(run: Run, result: Result, cancelled: dict[str, tuple[int, int]]) -> None:
    """Add the check that every schedule ``cancelled`` names ended: once the bridge stored what
    its partition holds up to each cancel (Redis's watermarks), none delivers an occurrence due
    after, read for a while past that moment."""
    shards = [Shard(run.delay, p) for p in range(PARTITIONS)]
    wanted = {
        p: max((o for q, o in cancelled.values() if q == p), default=-1) for p in range(PARTITIONS)
    }
    client = run.servers.redis()
    try:
        store = Store(client, run.prefix)
        deadline = time.monotonic() + 120

        def read() -> bool:
            marks = store.inventory.watermarks(shards)
            return all(marks.get(s, -1) >= wanted[s.partition] for s in shards)

        while not read() and time.monotonic() < deadline:
            time.sleep(0.2)
        # Past the watermark, the look in the other partitions takes a moment more (across.py).
        settled_ms = now_ms() + 1000
        after = occurrences_after(run.servers.bootstrap, run.target, set(cancelled), settled_ms)
        # Every schedule of the run ended by now (by its count, a cancel, or a record naming one
        # of its records by origin): the registry has none left, its count as its entries.
        while store.registry.counts(shards)[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = store.registry.counts(shards)[0]
        live = sum(len(at) for at in store.registry.at(shards).values())
        if left or live:
            entries = {
                (s.partition, k, v)
                for s in shards
                for k, v in cast(
                    dict[bytes, bytes], client.hgetall(store.keys(s).schedules)
                ).items()
                if k.startswith(b"=") and not v.startswith(b"-")
            }
            print(f"   left in the registry: {sorted(entries)[:10]}", file=sys.stderr, flush=True)
    finally:
        client.close()
    result.checks["every cancelled schedule ended"] = not after
    result.checks["no schedule left in the registry"] = left == live == 0
    result.notes.append(
        f"{len(cancelled)} schedules cancelled from random partitions while running: "
        f"{len({sid for sid, _ in after})} delivered after the end; {left} left in the registry"
    )
    if after:
        print(f"   after their cancel: {sorted(after)[:10]}", file=sys.stderr, flush=True)
        places = {sid: cancelled[sid] for sid, _ in after}
        print(f"   those cancels (partition, offset): {places}", file=sys.stderr, flush=True)


def occurrences_after(
    bootstrap: str, target: str, ids: set[str], after_ms: int, read_s: float = 6.0
) -> list[Occurrence]:
    """The occurrences of the schedules ``ids`` in ``target`` due after ``after_ms``: read from
    the beginning until ``read_s`` past that moment (three intervals of the adversary's)."""
    consumer = _from_the_start(bootstrap, target)
    found: list[Occurrence] = []
    try:
        while now_ms() < after_ms + read_s * 1000:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                headers = dict(headers_of(msg))
                sid = (headers.get(H_ID) or b"").decode(errors="replace")
                occurrence = headers.get(H_OCCURRENCE)
                if sid in ids and occurrence is not None and int(occurrence) > after_ms:
                    found.append((sid, int(occurrence)))
    finally:
        consumer.close()
    return found
