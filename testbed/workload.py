"""What the harness schedules: numbered records at a steady rate, and hostile ones.

Every value starts with ``seq:<n>:`` so a delivered or dead-lettered record is matched to the
delay-topic record it came from whatever its headers said.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, Producer

from bridge.kafka import produce
from bridge.message import (
    H_CANCEL,
    H_DELIVER_AT,
    H_DUE_AT,
    H_ID,
    H_PRIORITY,
    H_TARGET_TOPIC,
    Headers,
    Priority,
    wire_headers,
)

FILLER = b"x" * 100
# librdkafka's log level for the harness's own clients: critical only. The faults make them fail
# to connect for seconds at a time (a broker restart: hundreds of lines), and what they lose is
# what the checker's accounting is for.
CLIENT_LOG_LEVEL = 2


@dataclass
class ReadOnce:
    """The log positions a reader of the outputs has read. Its group commits nothing, so when it
    rebalances (a broker restarted, a topic's metadata came late to its subscription) it reads
    its partitions again from their start: a record read again at the same position is the one
    delivery it was, never a second one. Those are counted in ``again``."""

    positions: set[tuple[str, int, int]] = field(default_factory=set)
    again: int = 0

    def first(self, msg: Message) -> bool:
        """Whether ``msg`` is read here for the first time (counted in ``again`` if not)."""
        where = (msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
        if where in self.positions:
            self.again += 1
            return False
        self.positions.add(where)
        return True


def value_of(seq: int, size: int | None = None) -> bytes:
    """``seq:<n>:`` and 100 filler bytes, or padded to exactly ``size`` bytes."""
    head = b"seq:%d:" % seq
    return head + (FILLER if size is None else b"x" * max(0, size - len(head)))


def seq_of(value: bytes | None) -> int | None:
    if not value or not value.startswith(b"seq:"):
        return None
    end = value.find(b":", 4)
    return int(value[4:end]) if end > 4 else None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Record:
    """One record to produce; its value is always the seq value."""

    headers: Headers
    key: bytes | None = None
    delay_ms: int | None = None  # due this long after it is produced (a delay-deliver-at header)


@dataclass
class Workload:
    """Produces records to the delay topic from a thread, at most ``rate`` per second."""

    bootstrap: str
    topic: str
    records: Sequence[Record]
    rate: float
    value_size: int | None = None  # see value_of
    first_seq: int = 0  # the seq of records[0]; the next ones count up from it
    produced: int = 0
    failed: list[str] = field(default_factory=list)
    # When Kafka acknowledged each record (epoch ms, by seq): written to every in-sync replica
    # (acks=all), so readable by consumers, which its append time alone does not say.
    acked_ms: dict[int, int] = field(default_factory=dict)
    _thread: threading.Thread | None = None

    def start(self) -> Workload:
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the workload did not finish within {timeout}s")

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "delivery.timeout.ms": 300_000,
                "log_level": CLIENT_LOG_LEVEL,
            }
        )

        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self.failed.append(err.str())
            elif (seq := seq_of(msg.value())) is not None:
                self.acked_ms[seq] = now_ms()

        started = time.monotonic()
        for seq, rec in enumerate(self.records):
            ahead = seq / self.rate - (time.monotonic() - started)
            if ahead > 0:
                producer.poll(ahead)  # pacing, serving delivery reports meanwhile
            headers = list(rec.headers)
            if rec.delay_ms is not None:
                headers.append((H_DELIVER_AT, str(now_ms() + rec.delay_ms).encode()))
            produce(
                producer,
                self.topic,
                value=value_of(self.first_seq + seq, self.value_size),
                key=rec.key,
                headers=wire_headers(headers),
                on_delivery=report,
            )
            self.produced += 1
            producer.poll(0)
        remaining = producer.flush(300)
        if remaining:
            self.failed.append(f"{remaining} records unacknowledged")


def steady(
    count: int, target: str, max_delay_ms: int, seed: int, min_delay_ms: int = 0
) -> list[Record]:
    """``count`` records due min_delay_ms..max_delay_ms after each is produced, as absolute
    times."""
    rng = random.Random(seed)
    header: Headers = [(H_TARGET_TOPIC, target.encode())]
    return [
        Record(header, key=b"k%d" % (i % 997), delay_ms=rng.randint(min_delay_ms, max_delay_ms))
        for i in range(count)
    ]


# A backlog's priorities, interleaved: 10% high, 60% normal, 30% low in every ten records.
PRIORITY_MIX = (
    Priority.HIGH,
    Priority.NORMAL,
    Priority.LOW,
    Priority.NORMAL,
    Priority.NORMAL,
    Priority.LOW,
    Priority.NORMAL,
    Priority.NORMAL,
    Priority.LOW,
    Priority.NORMAL,
)


def prioritised(count: int, target: str, due: bytes) -> list[Record]:
    """``count`` records due at ``due`` (a delay-deliver-at value), their priorities in
    PRIORITY_MIX's order, keys cycling over the partitions: every partition gets every priority."""
    return [
        Record(
            [
                (H_TARGET_TOPIC, target.encode()),
                (H_DELIVER_AT, due),
                (H_PRIORITY, PRIORITY_MIX[i % len(PRIORITY_MIX)].label.encode()),
            ],
            key=b"k%d" % (i % 997),
        )
        for i in range(count)
    ]


# ---------------------------------------------------------------- hostile input

_ODD_VALUES = [
    b"0ms",
    b"1s",
    b"2500ms",
    b"3s",
    b"7d",
    b"1h30m",
    b"-1",
    b"-0",
    b"1e309",
    b"NaN",
    b"inf",
    b" 5s",
    b"5 s",
    b"5S",
    b"0x10",
    b"\xff\xfe\x00",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"99999-01-01T00:00:00Z",
    b"1970-01-01T00:00:00Z",
    b"2026-02-30T00:00:00Z",
    b"2026-11-21T10:00:00+25:00",
    b"2026-11-21T10:00:00",
    b"2026-11-21T10:00:60Z",
    b"18446744073709551616",
    b"9" * 40,
    b"100000d",
    b"0",
    b"1",
]


def hostile(count: int, target: str, seed: int) -> list[Record]:
    """``count`` records whose control headers hypothesis generates: random bytes, huge values,
    invalid UTF-8, duplicated and empty headers, absurd dates — mixed with plausible ones."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from bridge.message import H_AFTER, H_ID, H_TARGET_KEY

    names = [H_DELIVER_AT, H_AFTER, H_TARGET_TOPIC, H_TARGET_KEY, H_ID, "Delay-After", "x-trace"]
    values = st.one_of(
        st.binary(max_size=48),
        st.text(max_size=24).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.just(b""),
        st.integers(100, 160_000).map(lambda n: b"9" * n),
        st.sampled_from(_ODD_VALUES),
        st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()),
        st.just(target.encode()),
    )
    base = st.sampled_from(
        [
            [],
            [(H_TARGET_TOPIC, target.encode())],
            [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"1s")],
        ]
    )
    extras = st.lists(st.tuples(st.sampled_from(names), values), max_size=5)
    keys = st.one_of(st.none(), st.binary(max_size=32))
    records = st.builds(lambda b, e, k: Record([*b, *e], key=k), base, extras, keys)

    drawn: list[Record] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(records)
    def collect(record: Record) -> None:
        drawn.append(record)

    collect()
    return drawn[:count]


# What stalled a stage once, and values around it: digits of other scripts (str.isdigit() says
# yes, int() refuses "²"), numbers past every limit, leading zeros, signs.
_HOSTILE_TAILS = [
    "\u00b2",
    "\u0663",
    "\u0bef",
    "9" * 5000,
    "99999999999999999999",
    "007",
    "-1",
    " 1",
    "1 ",
    "",
    "0x10",
]
_IDS = ["order-1", "order-2", "order-3", "订单-4", "id:with:colons", "x" * 256, "ok-\u00b2"]


def adversarial(
    count: int,
    target: str,
    delay: str,
    partitions: int,
    *,
    seed: int,
    max_bytes: int,
    priorities: bool = False,
) -> list[Record]:
    """``count`` records an adversary produces at once (seeded): valid ones with and without
    delay-ids, replacements and cancels by caller-given ids and by default ids of any partition
    (real offsets among them) with tails drawn from every script's digits and past every limit,
    cancels with due-time hints, records around ``max_bytes`` (limits.max_record_bytes), and
    hypothesis-generated header sets (:func:`hostile`). ``priorities``: each valid record also
    in a lane drawn from PRIORITY_MIX (by an RNG of its own: the rest is the same records)."""
    rng = random.Random(seed)
    lanes = random.Random(seed + 1)
    t = (H_TARGET_TOPIC, target.encode())

    def to_target() -> Headers:
        if not priorities:
            return [t]
        return [t, (H_PRIORITY, lanes.choice(PRIORITY_MIX).label.encode())]

    generated = iter(hostile(max(1, count // 5), target, rng.randrange(1 << 30)))

    def default_id() -> str:
        tail = str(rng.randrange(0, 3 * count // partitions + 1))
        if rng.random() < 0.4:
            tail = rng.choice(_HOSTILE_TAILS)
        return f"{delay}:{rng.randrange(-1, partitions + 1)}:{tail}"

    def some_id() -> bytes:
        return (rng.choice(_IDS) if rng.random() < 0.5 else default_id()).encode()

    out: list[Record] = []
    for _ in range(count):
        roll, key = (
            rng.random(),
            rng.choice([None, b"k", b"customer-1", bytes([rng.randrange(256)])]),
        )
        if roll < 0.45:
            out.append(Record(to_target(), key=key, delay_ms=rng.randint(0, 4000)))
        elif roll < 0.6:
            out.append(
                Record([*to_target(), (H_ID, some_id())], key=key, delay_ms=rng.randint(500, 5000))
            )
        elif roll < 0.72:
            out.append(Record([(H_CANCEL, some_id())], key=key))
        elif roll < 0.77:
            hint = rng.choice([str(now_ms() + 3000), "9" * 5000, "\u00b2", "-1"]).encode()
            out.append(Record([(H_CANCEL, some_id()), (H_DUE_AT, hint)], key=key))
        elif roll < 0.82:
            pad = max(0, max_bytes - 200 + rng.randint(-8, 8) * 16)
            out.append(
                Record([*to_target(), ("pad", b"p" * pad)], key=key, delay_ms=rng.randint(0, 3000))
            )
        else:
            out.append(next(generated, Record([t], key=key, delay_ms=0)))
    return out


@dataclass
class TransactionScene:
    """A record with its own delay-id, produced in a transaction to ``partition``, due
    ``lead_ms`` later; another producer's transaction opened in the same partition right after
    and held open ``open_past_due_ms`` past the due time, then committed or aborted
    (``commit``); and the record's cancel, produced a second before the due time, behind that
    open transaction: in the log in time, unreadable until it ends. The record must be
    withdrawn. Its three records are seqs ``first_seq`` (the record), +1 (the open
    transaction's, due in an hour) and +2 (the cancel); ``acked_ms`` says when Kafka took the
    record (its commit) and the cancel."""

    bootstrap: str
    topic: str
    target: str
    partition: int
    first_seq: int
    open_past_due_ms: int
    commit: bool
    lead_ms: int = 3_000
    acked_ms: dict[int, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def play(self) -> TransactionScene:
        seq = self.first_seq
        sid = b"txn-%d" % seq
        due_ms = now_ms() + self.lead_ms
        mine, held = self._transactional("mine"), self._transactional("held")
        plain = Producer({"bootstrap.servers": self.bootstrap, "log_level": CLIENT_LOG_LEVEL})
        plain.list_topics(self.topic, timeout=30)  # the cancel goes at once when it is time
        try:
            record: Headers = [(H_TARGET_TOPIC, self.target.encode()), (H_ID, sid)]
            record.append((H_DELIVER_AT, b"%d" % due_ms))
            mine.begin_transaction()
            self._produce(mine, seq, record)
            mine.commit_transaction(30)
            self.acked_ms[seq] = now_ms()
            held.begin_transaction()
            self._produce(held, seq + 1, [(H_TARGET_TOPIC, self.target.encode())], hour=True)
            held.flush(30)  # appended, not committed: the partition's end moved past it
            _until(due_ms - 1_000)
            self._produce(plain, seq + 2, [(H_CANCEL, sid)])
            if plain.flush(30) == 0:
                self.acked_ms[seq + 2] = now_ms()
            _until(due_ms + self.open_past_due_ms)
            if self.commit:
                held.commit_transaction(30)
            else:
                held.abort_transaction(30)
        except Exception as exc:  # a fault broke it: the oracle holds what Kafka took
            self.notes.append(f"transaction scene {seq}: {exc}")
        return self

    def _transactional(self, name: str) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"{self.topic}-scene-{self.first_seq}-{name}",
                "log_level": CLIENT_LOG_LEVEL,
            }
        )
        producer.init_transactions(30)
        return producer

    def _produce(self, producer: Producer, seq: int, headers: Headers, hour: bool = False) -> None:
        if hour:
            headers = [*headers, (H_DELIVER_AT, b"%d" % (now_ms() + 3_600_000))]
        produce(
            producer,
            self.topic,
            partition=self.partition,
            key=b"txn",
            value=value_of(seq),
            headers=wire_headers(headers),
        )


def _until(epoch_ms: int) -> None:
    """Wait until the wall clock reads ``epoch_ms`` (the scene's timing, not a wait on a
    condition)."""
    time.sleep(max(0.0, epoch_ms - now_ms()) / 1000)
