"""The checker: accounts for every offset of the delay topic.

It reads the target topics and the DLQ from the start while a scenario runs, then reads the delay
topic itself and decides for each record what the contract requires — the bridge's own parser is
the oracle for *what* a record asks for (it has its own unit tests); the checker verifies that the
pipeline did it: delivered at least once and never before its due time, or dead-lettered with the
reason, or (for a record due after the run) still scheduled in Redis. Anything else is lost.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from bridge.catchup import LIVE_MARGIN_MS
from bridge.dialects import parse_record
from bridge.message import (
    H_DUE_AT,
    H_ERROR,
    H_ERROR_DETAIL,
    H_ID,
    H_ORIGIN,
    Cancel,
    Headers,
    Reason,
    Rejected,
    Rules,
    parse_count,
    parse_time_ms,
)
from bridge.store import Shard, Store, replaced_exactly
from testbed.background import Background
from testbed.workload import CLIENT_LOG_LEVEL, ReadOnce, now_ms, seq_of

# The longest a record due during a fault may wait once the fault is over (Account.recovery_ms).
RECOVERY_BOUND_AFTER_FAULT_MS = 3_000
# At least once, a record (or an occurrence) delivered again must have been in flight at a fault:
# its first copy delivered within this of one (before it: a claim or an acknowledgement the
# fault lost; during it: a lease run out while its holder stood still).
IN_FLIGHT_MS = 15_000


def in_flight(first_ms: int, faults: Sequence[tuple[int, int]]) -> bool:
    """Whether a copy delivered first at ``first_ms`` was in flight at one of ``faults`` (when
    each began and ended, epoch ms): it came within :data:`IN_FLIGHT_MS` of one."""
    return any(b - IN_FLIGHT_MS <= first_ms <= e + IN_FLIGHT_MS for b, e in faults)


@dataclass(frozen=True)
class Seen:
    """A delivered or dead-lettered record as the checker saw it."""

    seen_ms: int
    timestamp_ms: int
    delay_id: str
    due_header: int | None
    reason: str | None
    origin: str | None


@dataclass(frozen=True)
class Expected:
    """What the contract requires of one delay-topic record."""

    offset: str  # topic:partition:offset
    produced_ms: int
    due_ms: int | None = None  # deliver at this time
    delay_id: str = ""
    reason: str | None = None  # or dead-letter with this reason
    # Another valid record or a cancel has its delay-id (later in its partition, or stamped no
    # earlier in another): it replaces or cancels this one if it came while this one waited, so
    # this one may never arrive.
    replaceable: bool = False
    # Its delay topic was deleted while it may have waited as a reference (its payload still in
    # Kafka): dead-lettered as payload-missing at its due time is right too.
    payload_may_go: bool = False
    # An operator's fire or reschedule is the record again (its value, so its seq) with a new due
    # time, replacing exactly the one before it while that waits (delay-replaces): this is the
    # last of them, and these the due times of the ones before it. One of them is delivered: an
    # earlier one when it was claimed before its replacement was read (which then schedules
    # nothing), else this one.
    earlier_dues: tuple[int, ...] = ()
    # A copy of the record that was refused (a replacement too large, a DLQ replay refused
    # again) is dead-lettered with one of these reasons besides what this one asks for.
    also_dead: frozenset[str] = frozenset()
    # Of a record with a caller-given delay-id: the seqs of the cancels and replacements that
    # name it later in its partition. One Kafka acknowledged 100 ms before its due time wins
    # (README: see :func:`cancels_lost`).
    withdrawn_by: tuple[int, ...] = ()


def _header(headers: Headers, name: str) -> bytes | None:
    """The last ``name`` header: the bridge appends its own after a producer's."""
    for k, v in reversed(headers):
        if k == name:
            return v
    return None


@dataclass
class Checker(Background):
    """Collects the outputs in a thread; :meth:`account` settles every delay-topic offset."""

    bootstrap: str
    outputs: list[str]
    group: str
    delivered: dict[int, list[Seen]] = field(default_factory=lambda: collections.defaultdict(list))
    dead: dict[int, list[Seen]] = field(default_factory=lambda: collections.defaultdict(list))
    strays: int = 0
    # Every output record read: one read again (the checker's group lost its position when the
    # broker restarted) is no second delivery.
    read: ReadOnce = field(default_factory=ReadOnce)
    # (delay-origin, due ms) -> seqs of records whose payload may go (Expected.payload_may_go):
    # a payload-missing DLQ record has no value to read its seq from. Records of two incarnations
    # of a topic at one offset can be due at the same ms: each DLQ record takes one of them.
    origins: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    thread_name = "checker"

    @property
    def dlq(self) -> str:
        """The last output topic is the DLQ."""
        return self.outputs[-1]

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                # What a consumer of the targets sees with exactly-once delivery (librdkafka's
                # default, said here: a record of an aborted transaction is no delivery).
                "isolation.level": "read_committed",
                "log_level": CLIENT_LOG_LEVEL,
            }
        )
        consumer.subscribe(self.outputs)
        try:
            while not self._stop.is_set():
                # poll returns on the first record and consume(…, 0) takes what is already
                # fetched, so each record is stamped when it arrives, not at a batch timeout.
                first = consumer.poll(0.1)
                if first is None:
                    continue
                for msg in [first, *consumer.consume(999, 0)]:
                    if msg.error() is None:
                        self._take(msg)
        finally:
            consumer.close()

    def add_origins(self, expected: dict[int, Expected]) -> None:
        """Records whose payload may go: their payload-missing DLQ records count for them."""
        for seq, exp in expected.items():
            self.origins.setdefault((exp.offset, exp.due_ms or -1), []).append(seq)

    def _origin_seq(self, origin: str, due_ms: int) -> int | None:
        """The seq a payload-missing DLQ record of ``origin`` due at ``due_ms`` stands for: the
        first record there not dead-lettered yet (a second copy goes to the last)."""
        seqs = self.origins.get((origin, due_ms), [])
        return next((s for s in seqs if not self.dead.get(s)), seqs[-1] if seqs else None)

    def _take(self, msg: Message) -> None:
        seen = now_ms()
        if not self.read.first(msg):
            return
        headers: Headers = list(msg.headers() or [])  # type: ignore[arg-type]
        seq = seq_of(msg.value())
        due = _header(headers, H_DUE_AT)
        reason = _header(headers, H_ERROR)
        origin = _header(headers, H_ORIGIN)
        if seq is None and reason == Reason.PAYLOAD_MISSING.value.encode() and origin:
            seq = self._origin_seq(origin.decode(), _due_in(_header(headers, H_ERROR_DETAIL)))
        if seq is None:
            self.strays += 1
            return
        entry = Seen(
            seen,
            msg.timestamp()[1],
            (_header(headers, H_ID) or b"").decode(errors="replace"),
            parse_count(due),
            reason.decode() if reason else None,
            origin.decode() if origin else None,
        )
        (self.dead if msg.topic() == self.dlq else self.delivered)[seq].append(entry)


def _due_in(detail: bytes | None) -> int:
    """The due time a payload-missing detail names ("... (due <RFC 3339>) ..."), else -1."""
    found = re.search(rb"\(due (\S+)\)", detail or b"")
    return -1 if found is None else parse_time_ms(found.group(1).decode())


def read_topic(bootstrap: str, topic: str, partitions: int) -> list[Message]:
    """Every record of ``topic``, read to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}",
            "enable.auto.commit": False,
            "log_level": CLIENT_LOG_LEVEL,
        }
    )
    try:
        ends = {p: log_end(consumer, TopicPartition(topic, p)) for p in range(partitions)}
        assigned = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        consumer.assign(assigned)
        out: list[Message] = []
        deadline = time.monotonic() + 120
        # Read to each partition's end by position, not by count: transaction markers (a
        # schedule carried on with exactly-once) and aborted records take offsets too.
        while any(max(tp.offset, 0) < ends[tp.partition] for tp in consumer.position(assigned)):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end")
            out += [m for m in consumer.consume(5000, 0.5) if m.error() is None]
        return out
    finally:
        consumer.close()


_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


def log_end(consumer: Consumer, tp: TopicPartition, timeout: float = 60) -> int:
    """``tp``'s log end offset; asked again while its leadership moves (after a broker roll the
    metadata may still name the broker that led it: NOT_LEADER_FOR_PARTITION)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=30)[1])
        except KafkaException as exc:
            if exc.args[0].code() not in _MOVING or time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # back-off before asking again (metadata refreshes meanwhile)


def expectations(messages: list[Message], rules: Rules) -> dict[int, Expected]:
    """What each delay-topic record asks for, by seq."""
    out: dict[int, Expected] = {}
    # (topic, an id) -> (partition, offset, timestamp, seq or None) of each record that names it:
    # a cancel, or a record with it as its delay-id (a caller's, or the default one: an id like
    # any other)
    # (partition, offset, stamp, seq, the one offset it replaces exactly: an operator's copy)
    namers: dict[tuple[str, str], list[tuple[int, int, int, int | None, int | None]]] = {}
    # Each valid record and the names it answers to: its delay-id, and its origin (a cancel or a
    # replacement of <topic>:<partition>:<offset> withdraws the record there, whatever its id).
    valid: list[tuple[str, int, int, int, int, set[str]]] = []
    for msg in sorted(
        messages, key=lambda m: (m.topic() or "", m.partition() or 0, m.offset() or 0)
    ):
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        seq = seq_of(msg.value())
        ts = msg.timestamp()[1]
        where = f"{topic}:{partition}:{offset}"
        try:
            rec = parse_record(
                rules,
                topic=topic,
                partition=partition,
                offset=offset,
                timestamp_ms=ts,
                key=msg.key(),
                value=msg.value(),
                headers=list(msg.headers() or []),  # type: ignore[arg-type]
                now_ms=ts,
            )
            if isinstance(rec, Cancel):  # delivered nowhere (a command's has no seq)
                for each in rec.each():
                    namers.setdefault((topic, each.delay_id), []).append(
                        (partition, offset, ts, seq, None)
                    )
                continue
            if rec.recurring:  # its occurrences are the recurring scenario's to check
                continue
            assert seq is not None, f"{where} has no seq value"
            out[seq] = met_again(out.get(seq), Expected(where, ts, rec.due_ms, rec.delay_id))
            exactly = replaced_exactly(Shard(topic, partition), rec)
            namers.setdefault((topic, rec.delay_id), []).append(
                (partition, offset, ts, seq, exactly)
            )
            valid.append((topic, partition, offset, ts, seq, {rec.delay_id, where}))
        except Rejected as rejection:
            assert seq is not None, f"{where} has no seq value"
            out[seq] = met_again(out.get(seq), Expected(where, ts, reason=rejection.reason.value))
    # A schedule's identity is (delay topic, delay-id): a record is replaced or cancelled by a
    # later record naming it in its partition, or by one in another partition stamped no
    # earlier (whichever of the two the ingress reads second withdraws the other, if it still
    # waits): it may never arrive.
    # A record an operator's copy of it replaced (see Expected.earlier_dues) counts too: a copy
    # that comes after a producer's cancel or replacement withdrew it schedules nothing. Copies
    # of one seq name each other (its delay-id, its origin), so they are not such a namer.
    copies: dict[int, set[tuple[int, int]]] = {}
    for _, partition, offset, _, seq, _ in valid:
        copies.setdefault(seq, set()).add((partition, offset))
    for topic, partition, offset, ts, seq, names in valid:
        later = [
            n
            for name in names
            for n in namers.get((topic, name), [])
            if (n[0], n[1]) not in copies[seq]
        ]
        if any(
            (p == partition and o > offset) or (p != partition and t >= ts) for p, o, t, *_ in later
        ):
            out[seq] = dataclasses.replace(out[seq], replaceable=True)
        given = not out[seq].delay_id.startswith(f"{topic}:")  # not a default id, nor its copy's
        # Must withdraw it: a later record of its partition naming it — but an operator's copy
        # that replaces another record exactly (delay-replaces) replaces that one only, and
        # nothing once it was replaced (docs/contract.md): it may, not must (a rebuild from a
        # later offset than that record's replaces by the id).
        here = tuple(
            s
            for p, o, _, s, exactly in later
            if p == partition and o > offset and s is not None and exactly in (None, offset)
        )
        if given:  # the last copy's: what names it later names every copy before it
            out[seq] = dataclasses.replace(out[seq], withdrawn_by=here)
    return out


def cancels_lost(
    checker: Checker, expected: Mapping[int, Expected], acked_ms: Mapping[int, int]
) -> tuple[int, list[tuple[int, str]]]:
    """Of the records with a caller-given delay-id that a cancel or a replacement naming them
    later in their partition reached in time — acknowledged by Kafka (``acked_ms``, by seq: the
    workload's) at least LIVE_MARGIN_MS before their due time, the earliest of an operator's
    copies', which README says always wins —: how many, and those delivered all the same. A
    cancel without a seq (an operator's command) is left out: when Kafka took it is not known."""
    covered, lost = 0, []  # (seq, what)
    for seq, exp in expected.items():
        if not exp.withdrawn_by or exp.due_ms is None:
            continue
        due = min((exp.due_ms, *exp.earlier_dues))
        acks = [acked_ms[s] for s in exp.withdrawn_by if s in acked_ms]
        if not acks or min(acks) > due - LIVE_MARGIN_MS:
            continue
        covered += 1
        if seen := checker.delivered.get(seq):
            what = f"{exp.offset} (seq {seq}): delivered, its cancel or replacement acknowledged "
            when = f"; due {_clock(due)}, appended to its target at {_clock(seen[0].timestamp_ms)}"
            lost.append((seq, f"{what}{due - min(acks)} ms before its due time{when}"))
    return covered, lost


def _clock(epoch_ms: int) -> str:
    """``epoch_ms`` as the logs' time of day, to the ms."""
    return f"{time.strftime('%H:%M:%S', time.localtime(epoch_ms / 1000))}.{epoch_ms % 1000:03d}"


def met_again(before: Expected | None, now: Expected) -> Expected:
    """The expectation of a seq met again (``now``, later in its partition: an operator's
    replacement, a DLQ replay) after ``before``: the last valid record of it is the one that must
    arrive, the others' due times and reasons are allowed besides."""
    if before is None:
        return now
    dead = before.also_dead | ({before.reason} if before.reason else set())
    if now.reason is not None and before.due_ms is not None:  # a refused copy of a valid one
        return dataclasses.replace(before, also_dead=dead | {now.reason})
    dues = before.earlier_dues + ((before.due_ms,) if before.due_ms is not None else ())
    return dataclasses.replace(now, earlier_dues=dues, also_dead=dead - {now.reason})


@dataclass
class Account:
    """The result of settling every offset."""

    records: int
    delivered: int = 0
    dead_lettered: int = 0
    scheduled: int = 0  # due after the run, found waiting in Redis
    replaced: int = 0  # never arrived: a later record with its delay-id replaced it
    lost: list[str] = field(default_factory=list)
    misrouted: list[str] = field(default_factory=list)
    duplicates: int = 0
    twice: list[str] = field(default_factory=list)  # the records delivered more than once
    # Of ``twice``, those whose first copy came nowhere near a fault (see IN_FLIGHT_MS).
    stray: list[str] = field(default_factory=list)
    duplicate_ids_differ: int = 0
    early: list[str] = field(default_factory=list)
    lateness_ms: list[int] = field(default_factory=list)  # first arrival at the checker
    stamp_lateness_ms: list[int] = field(default_factory=list)  # by the delivered timestamp
    # Each record's lateness split at the end of the last fault before it arrived: the share
    # the fault explains (from its due time to the fault's end) and the bridge's own after it
    # (from the later of the two to its arrival). Without faults, all of it is "after".
    during_fault_ms: list[int] = field(default_factory=list)
    after_fault_ms: list[int] = field(default_factory=list)
    faults_timed: bool = False  # the scenario said when its faults ended
    # The records latest after the fault: (ms after it, offset, due ms, arrival ms), worst first.
    slowest: list[tuple[int, str, int, int]] = field(default_factory=list)

    @property
    def max_lateness_ms(self) -> int:
        return max(self.lateness_ms, default=0)

    @property
    def recovery_ms(self) -> int:
        """The longest a record waited after the fault that held it ended (or after its due
        time, if that was later): how long the bridge takes to recover once a fault is over."""
        return max(self.after_fault_ms, default=0)

    @property
    def max_during_fault_ms(self) -> int:
        return max(self.during_fault_ms, default=0)

    def quantile_ms(self, q: float) -> int:
        return quantile(self.lateness_ms, q)


def quantile(values: list[int], q: float) -> int:
    """The ``q`` quantile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def settle(
    checker: Checker,
    expected: dict[int, Expected],
    horizon_ms: int,
    store: Store | None = None,
    faults: Sequence[tuple[int, int]] = (),
    *,
    by_append: bool = False,
) -> Account:
    """Account for every record; records due after ``horizon_ms`` must be waiting in ``store``.
    ``faults``: when each fault began and ended (ms), to split lateness into during and after
    them, by when the checker saw a record, or by its target's append time (``by_append``: the
    target topic stamps LogAppendTime, and the fault delays the checker's own consumer too). A
    record that arrived while a fault lasted was late for the fault alone."""
    acc = Account(records=len(expected), faults_timed=bool(faults))
    ends = sorted(end for _, end in faults)

    def twice(what: str, copies: list[Seen]) -> None:
        acc.twice.append(what)
        first = min(g.timestamp_ms for g in copies)
        if not in_flight(first, faults):
            acc.stray.append(f"{what}, the first at {first}")

    for seq, exp in expected.items():
        got, dead = checker.delivered.get(seq, []), checker.dead.get(seq, [])
        if exp.also_dead:
            dead = [d for d in dead if d.reason not in exp.also_dead]
        if exp.earlier_dues:
            got, before = _earlier(acc, exp, got, twice)
            if before and not got:  # claimed before its copy was read: that one is its delivery
                acc.delivered += 1
                continue
        if exp.reason is not None:
            if dead and all(d.reason == exp.reason for d in dead) and not got:
                acc.dead_lettered += 1
            elif got or dead:
                acc.misrouted.append(
                    f"{exp.offset}: expected DLQ {exp.reason}, got "
                    f"{[d.reason for d in dead]} and {len(got)} deliveries"
                )
            else:
                acc.lost.append(exp.offset)
            continue
        assert exp.due_ms is not None
        if (
            dead
            and not got
            and exp.payload_may_go
            and all(d.reason == Reason.PAYLOAD_MISSING.value for d in dead)
        ):
            acc.dead_lettered += 1
            acc.early += [
                f"{exp.offset}: dead-lettered at {d.timestamp_ms} < due {exp.due_ms}"
                for d in dead
                if d.timestamp_ms < exp.due_ms
            ]
            continue
        if dead:
            acc.misrouted.append(f"{exp.offset}: valid, dead-lettered as {dead[0].reason}")
            continue
        if not got:
            if exp.due_ms > horizon_ms and store is not None and _waiting(store, exp.offset):
                acc.scheduled += 1
            elif exp.replaceable:
                acc.replaced += 1
            else:
                acc.lost.append(f"{exp.offset} (seq {seq})")  # seq: which incarnation's
            continue
        acc.delivered += 1
        acc.duplicates += len(got) - 1
        if len(got) > 1:
            twice(f"{exp.offset}: {len(got)} copies", got)
        if any(g.delay_id != exp.delay_id for g in got):
            acc.duplicate_ids_differ += 1
        for g in got:
            if g.seen_ms < exp.due_ms or g.timestamp_ms < exp.due_ms:
                acc.early.append(f"{exp.offset}: seen {g.seen_ms} < due {exp.due_ms}")
        due = max(exp.due_ms, exp.produced_ms)
        acc.lateness_ms.append(max(0, min(g.seen_ms for g in got) - due))
        first = min(g.timestamp_ms if by_append else g.seen_ms for g in got)
        if any(began <= first < end for began, end in faults):
            acc.during_fault_ms.append(max(0, first - due))
            acc.after_fault_ms.append(0)
        else:
            ended = (
                ends[bisect.bisect_right(ends, first) - 1] if ends and ends[0] <= first else None
            )
            acc.during_fault_ms.append(0 if ended is None else max(0, ended - due))
            acc.after_fault_ms.append(max(0, first - max(due, ended or 0)))
        acc.slowest.append((acc.after_fault_ms[-1], exp.offset, due, first))
        acc.stamp_lateness_ms.append(max(0, min(g.timestamp_ms for g in got) - due))
    acc.slowest = sorted(acc.slowest, reverse=True)[:10]
    return acc


def _earlier(
    acc: Account, exp: Expected, got: list[Seen], twice: Callable[[str, list[Seen]], None]
) -> tuple[list[Seen], list[Seen]]:
    """The deliveries of ``exp``'s own due time, and those of the records it replaced, checked
    here (each at or after its own due time): one delivery of the seq in all, any other is a
    duplicate."""
    theirs = [g for g in got if g.due_header != exp.due_ms]
    for g in theirs:
        if g.due_header not in exp.earlier_dues:
            acc.misrouted.append(f"{exp.offset}: delivered due {g.due_header}, asked for none")
        elif g.timestamp_ms < g.due_header or g.seen_ms < g.due_header:
            acc.early.append(f"{exp.offset}: a replaced copy seen {g.seen_ms} < due {g.due_header}")
    mine = [g for g in got if g.due_header == exp.due_ms]
    again = len(theirs) - (0 if mine else 1) if theirs else 0
    acc.duplicates += again
    if again:
        twice(f"{exp.offset}: {again} more, of an operator's copies", got)
    return mine, theirs


def _waiting(store: Store, where: str) -> bool:
    topic, partition, offset = where.rsplit(":", 2)
    return store.inventory.is_pending(Shard(topic, int(partition)), int(offset))


def wait_settled(
    checker: Checker, expected: dict[int, Expected], horizon_ms: int, timeout: float
) -> float:
    """Wait until every record due by ``horizon_ms`` has an outcome; returns seconds waited."""
    started = time.monotonic()
    todo = [
        s
        for s, e in expected.items()
        if not e.replaceable and (e.reason is not None or (e.due_ms or 0) <= horizon_ms)
    ]
    # A seq an operator moved: a delivery at one of its due times is the one to wait for.
    moved = {
        s: {*e.earlier_dues, e.due_ms}
        for s, e in expected.items()
        if e.earlier_dues and e.due_ms is not None
    }
    wait_seen(checker, todo, timeout, moved)
    return time.monotonic() - started


def wait_held(
    checker: Checker,
    expected: dict[int, Expected],
    horizon_ms: int,
    store: Store,
    timeout: float,
) -> set[int]:
    """Wait until every record due after ``horizon_ms`` (but one a later record may replace) is
    waiting in Redis, or was seen delivered (an operator fired it) or dead-lettered; returns the
    ones that were not within ``timeout``. A run's last bridge, or one rebuilding a Redis that
    lost everything, reads the delay topic again before it holds them."""
    later = {
        s: e.offset
        for s, e in expected.items()
        if e.reason is None and not e.replaceable and (e.due_ms or 0) > horizon_ms
    }

    def held(s: int) -> bool:
        return bool(checker.delivered.get(s) or checker.dead.get(s)) or _waiting(store, later[s])

    return _not_within(set(later), held, timeout)


def wait_seen(
    checker: Checker,
    seqs: Iterable[int],
    timeout: float,
    dues: Mapping[int, Collection[int]] | None = None,
) -> set[int]:
    """Wait until the checker saw each of ``seqs`` delivered (due at one of ``dues[seq]`` when
    given) or dead-lettered; returns the ones it did not see within ``timeout``. Only the unseen
    are looked at again."""
    due = dues or {}

    def seen(s: int) -> bool:
        got = checker.delivered.get(s, [])
        return bool(checker.dead.get(s)) or any(s not in due or g.due_header in due[s] for g in got)

    return _not_within(set(seqs), seen, timeout)


def _not_within(todo: set[int], done: Callable[[int], bool], timeout: float) -> set[int]:
    """Those of ``todo`` not ``done`` within ``timeout``; only those not done yet are asked
    again, every 0.2 s."""
    deadline = time.monotonic() + timeout
    while True:
        todo = {s for s in todo if not done(s)}
        if not todo or time.monotonic() >= deadline:
            return todo
        time.sleep(0.2)
